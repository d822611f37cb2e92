"""Device side of speculative decoding: a prefill step and a verify-and-draft step per bucket.

One speculative step, all on the device with no host sync:

    fill    -> B verify rows: per slot its last token plus the highest prefix-survival drafts
    target  -> one forward over the B flat rows (cost follows B), aux features for the drafter
    sample  -> the target's own token per row (argmax, or a sample keyed by position)
    verify  -> accepted prefix per slot + bonus token
    commit  -> seq_len += accepted + 1, stop ids / remaining cut what is emitted
    draft   -> the drafter's commit forward over the verified rows, then d draft steps

The compiled shapes are (B verify rows, d draft depth); everything else is data.
Axis legend: N slots, K max depth, B verify rows, T prefill rows, S stop ids per slot.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from lightspec_jax.models import KVCache, Qwen3
from lightspec_jax.pallas_kernels import commit, fill, verify

from .buckets import BucketRegistry
from .drafters import Drafter, DraftRows
from .runner import StepInputs, abstract, empty_step_inputs, forward_and_sample
from .sampling import sample

MAX_STOP_IDS = 16  # stop ids per request (EOS included) the device checks inside a span


class SpecState(NamedTuple):
    """Per-slot device state between steps (all donated)."""

    seq_len: jax.Array  # [N] int32: tokens whose target KV is committed
    last_token: jax.Array  # [N] int32: newest token, its KV not yet in the cache
    draft_tokens: jax.Array  # [N, K] int32: the current proposal (first proposal_len valid)
    draft_conf: jax.Array  # [N, K] f32: the drafter's probability of each drafted token
    proposal_len: jax.Array  # [N] int32


class PrefillExtras(NamedTuple):
    """What a prefill step needs beyond the plain step's inputs (numpy)."""

    row_next_token: np.ndarray  # [T] int32: x_{p+1} where it is a prompt token
    row_next_from_sample: np.ndarray  # [T] bool: x_{p+1} is the token sampled this step
    completes: np.ndarray  # [N] bool: the slot's prompt is fully prefilled after this step
    prompt_len: np.ndarray  # [N] int32


class SpecInputs(NamedTuple):
    """Host inputs of one speculative step (numpy, [N] unless noted)."""

    active: np.ndarray  # bool: slots that decode this step
    temperature: np.ndarray  # f32
    top_k: np.ndarray  # int32
    top_p: np.ndarray  # f32
    seed: np.ndarray  # uint32
    stop_ids: np.ndarray  # [N, S] int32, -1 padded
    remaining: np.ndarray  # int32: tokens the request may still emit


class SpecResult(NamedTuple):
    """Small per-slot results the host reads back."""

    out_tokens: jax.Array  # [N, K+1] committed target tokens (first num_emitted valid)
    num_emitted: jax.Array  # [N]
    finished: jax.Array  # [N] bool: a stop id or the remaining allowance was hit
    accepted: jax.Array  # [N] accepted draft tokens
    verified: jax.Array  # [N] draft tokens verified (the fill's lengths)
    stepped: jax.Array  # [N] bool


def _prefill_step(target: Qwen3, drafter: Drafter, d_leaves, cache: KVCache, dcache,
                  state: SpecState, inputs: StepInputs, extras: PrefillExtras):
    """Prompt chunks through the target and the drafter; completing slots get their first
    token and an empty proposal (their first speculative step verifies the target row only)."""
    out, tokens, new_tokens, last_token = forward_and_sample(
        target, cache, state.last_token, inputs, aux_layers=drafter.aux_layers)
    num_slots = state.seq_len.shape[0]
    sampled_next = new_tokens[jnp.clip(inputs.row_slot, 0, num_slots - 1)]
    rows = DraftRows(token=tokens,
                     next_token=jnp.where(extras.row_next_from_sample, sampled_next,
                                          extras.row_next_token),
                     hidden=out.aux_hidden, position=inputs.row_pos, slot=inputs.row_slot)
    dcache = drafter.prefill(d_leaves, dcache, rows, target_embed=target.embed[...])
    done = extras.completes
    state = SpecState(seq_len=jnp.where(done, extras.prompt_len, state.seq_len),
                      last_token=last_token, draft_tokens=state.draft_tokens,
                      draft_conf=state.draft_conf,
                      proposal_len=jnp.where(done, 0, state.proposal_len))
    return out.cache, dcache, state, new_tokens


def _spec_step(target: Qwen3, drafter: Drafter, d_leaves, cache: KVCache, dcache,
               state: SpecState, inputs: SpecInputs, *, num_rows: int, depth: int):
    num_slots, max_depth = state.draft_tokens.shape
    layout = fill(state.draft_conf, state.proposal_len, inputs.active, num_rows=num_rows)
    slot = jnp.clip(layout.row_slot, 0, num_slots - 1)  # [B]; padding rows read slot N-1
    offset = layout.row_offset  # [B]
    draft_at = state.draft_tokens[slot, jnp.clip(offset - 1, 0, max_depth - 1)]
    row_token = jnp.where(offset == 0, state.last_token[slot], draft_at)  # [B]
    row_pos = state.seq_len[slot] + offset  # [B]

    out = target(row_token, row_pos, layout.row_slot, cache, aux_layers=drafter.aux_layers)
    # The token sampled at a row is for position row_pos + 1: the same key plain decoding
    # would use there, so the committed tokens are exactly the target's own.
    target_tokens = sample(out.logits, inputs.temperature[slot], inputs.top_k[slot],
                           inputs.top_p[slot], inputs.seed[slot], row_pos + 1)  # [B]
    accepted, out_tokens, num_new = verify(target_tokens, layout, state.draft_tokens)
    hidden = out.aux_hidden if out.aux_hidden is not None else jnp.zeros((num_rows, 1))
    done = commit(out_tokens, num_new, accepted, layout, state.seq_len, inputs.active,
                  inputs.stop_ids, inputs.remaining, hidden)
    stepped = inputs.active & layout.slot_valid

    rows = DraftRows(token=row_token, next_token=target_tokens, hidden=out.aux_hidden,
                     position=row_pos, slot=layout.row_slot)
    dcache, proposal = drafter.propose(
        d_leaves, dcache, rows, tail_row=done.tail_row, bonus=done.new_last_token,
        new_seq_len=done.new_seq_len, stepped=stepped, depth=depth,
        target_embed=target.embed[...])
    pad = max_depth - depth
    state = SpecState(
        seq_len=done.new_seq_len,
        last_token=jnp.where(stepped, done.new_last_token, state.last_token),
        draft_tokens=jnp.pad(proposal.tokens, ((0, 0), (0, pad))),
        draft_conf=jnp.pad(proposal.confidence, ((0, 0), (0, pad))),
        proposal_len=jnp.where(stepped, depth, 0).astype(jnp.int32))
    result = SpecResult(out_tokens=out_tokens, num_emitted=done.num_emitted,
                        finished=done.finished, accepted=accepted, verified=layout.lengths,
                        stepped=stepped)
    return out.cache, dcache, state, result


class SpecRunner:
    """Owns the device state and the compiled prefill and speculative steps."""

    def __init__(self, target: Qwen3, drafter: Drafter, *, num_slots: int, cache_len: int,
                 max_depth: int, prefill_buckets: tuple[int, ...],
                 verify_buckets: tuple[int, ...], depths: tuple[int, ...],
                 show_progress: bool = True):
        from flax import nnx

        self.num_slots = num_slots
        self.max_depth = max_depth
        self.drafter = drafter
        graphdef, t_state = nnx.split(target)
        t_leaves, t_treedef = jax.tree.flatten(t_state)
        self._t_leaves = t_leaves
        self.cache = target.new_cache(num_slots=num_slots, max_len=cache_len)
        self.dcache = drafter.new_cache(num_slots=num_slots, cache_len=cache_len)
        self.state = SpecState(
            seq_len=jnp.zeros((num_slots,), jnp.int32),
            last_token=jnp.zeros((num_slots,), jnp.int32),
            draft_tokens=jnp.zeros((num_slots, max_depth), jnp.int32),
            draft_conf=jnp.zeros((num_slots, max_depth), jnp.float32),
            proposal_len=jnp.zeros((num_slots,), jnp.int32))
        merge = lambda leaves: nnx.merge(graphdef, jax.tree.unflatten(t_treedef, leaves))  # noqa: E731

        def prefill_step(t_leaves, d_leaves, cache, dcache, state, inputs, extras):
            return _prefill_step(merge(t_leaves), drafter, d_leaves, cache, dcache, state,
                                 inputs, extras)

        def make_spec_step(rows, depth):
            def spec_step(t_leaves, d_leaves, cache, dcache, state, inputs):
                return _spec_step(merge(t_leaves), drafter, d_leaves, cache, dcache, state,
                                  inputs, num_rows=rows, depth=depth)
            return spec_step

        donate = ("cache", "dcache", "state")
        common = (abstract(t_leaves), abstract(drafter.param_leaves), abstract(self.cache),
                  abstract(self.dcache), abstract(self.state))
        self.prefill_registry = BucketRegistry("prefill step", prefill_buckets)
        self.verify_registry = BucketRegistry("speculative step", verify_buckets)
        self.depths = tuple(sorted(depths))
        work = [("prefill", rows, None) for rows in self.prefill_registry.sizes]
        work += [("verify", rows, d) for rows in self.verify_registry.sizes for d in self.depths]
        for kind, rows, depth in tqdm(work, desc="compiling speculative buckets",
                                      disable=not show_progress, leave=False):
            if kind == "prefill":
                self.prefill_registry.compile(
                    rows, prefill_step, *common, abstract(empty_step_inputs(rows, num_slots)),
                    abstract(self.empty_extras(rows)), donate_argnames=donate)
            else:
                self.verify_registry.compile(
                    (rows, depth), make_spec_step(rows, depth), *common,
                    abstract(self.empty_spec_inputs()), donate_argnames=donate)

    @property
    def compile_seconds(self) -> float:
        return self.prefill_registry.compile_seconds + self.verify_registry.compile_seconds

    def empty_extras(self, rows: int) -> PrefillExtras:
        n = self.num_slots
        return PrefillExtras(row_next_token=np.zeros((rows,), np.int32),
                             row_next_from_sample=np.zeros((rows,), bool),
                             completes=np.zeros((n,), bool), prompt_len=np.zeros((n,), np.int32))

    def empty_spec_inputs(self) -> SpecInputs:
        n = self.num_slots
        return SpecInputs(active=np.zeros((n,), bool), temperature=np.zeros((n,), np.float32),
                          top_k=np.zeros((n,), np.int32), top_p=np.ones((n,), np.float32),
                          seed=np.zeros((n,), np.uint32),
                          stop_ids=np.full((n, MAX_STOP_IDS), -1, np.int32),
                          remaining=np.zeros((n,), np.int32))

    def run_prefill(self, inputs: StepInputs, extras: PrefillExtras) -> jax.Array:
        rows = inputs.row_slot.shape[0]
        self.cache, self.dcache, self.state, new_tokens = self.prefill_registry(
            rows, self._t_leaves, self.drafter.param_leaves, self.cache, self.dcache,
            self.state, inputs, extras)
        return new_tokens

    def run_spec(self, inputs: SpecInputs, *, rows: int, depth: int) -> SpecResult:
        self.cache, self.dcache, self.state, result = self.verify_registry(
            (rows, depth), self._t_leaves, self.drafter.param_leaves, self.cache, self.dcache,
            self.state, inputs)
        return result
