"""Device side of speculative decoding: compiled prefill, verify, draft-commit and draft steps.

One speculative step, all on the device with no host sync in between:

    verify  (per B)  fill -> B verify rows: per slot its last token plus the highest
                     prefix-survival drafts; target forward over the B flat rows (its cost
                     follows B); the target's own token per row (argmax, or a sample keyed by
                     position); accepted prefix + bonus; commit: seq_len += accepted + 1, stop
                     ids / allowances cut what is emitted
    commit  (per B)  the drafter's forward over the verified rows (its KV and first draft)
    draft   (per d)  d draft tokens per slot: the next proposal

Three executables instead of one per (B, d) pair: |B| + |B| + |d| compiles, not |B| x |d|.
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
    # Synthetic acceptance mode only (ignored otherwise): drafts each slot would have accepted
    # had its whole proposal been verified, and the confidences the fill ranks rows by.
    synthetic_accept: np.ndarray  # int32
    synthetic_conf: np.ndarray  # [N, K] f32


class SpecResult(NamedTuple):
    """Small per-slot results the host reads back."""

    out_tokens: jax.Array  # [N, K+1] committed target tokens (first num_emitted valid)
    num_emitted: jax.Array  # [N]
    finished: jax.Array  # [N] bool: a stop id or the remaining allowance was hit
    accepted: jax.Array  # [N] accepted draft tokens
    verified: jax.Array  # [N] draft tokens verified (the fill's lengths)
    stepped: jax.Array  # [N] bool
    confidence: jax.Array  # [N, K] the verified proposal's draft confidences


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


class VerifyOutput(NamedTuple):
    """What the verify stage hands the drafter's commit stage (device arrays)."""

    rows: DraftRows  # the B verify rows with the target's tokens and features
    tail_row: jax.Array  # [N]
    bonus: jax.Array  # [N]
    new_seq_len: jax.Array  # [N]
    stepped: jax.Array  # [N] bool


def _verify_step(target: Qwen3, aux_layers: tuple[int, ...], cache: KVCache, state: SpecState,
                 inputs: SpecInputs, *, num_rows: int, synthetic: bool = False):
    """fill -> target forward over B flat rows -> per-row target token -> verify -> commit.

    synthetic: acceptance and fill confidences come from `inputs.synthetic_*` (a workload
    profile drawn on the host) instead of exact match; every device cost stays real, but the
    emitted tokens are not the target's - benchmarks only, labelled wherever reported.
    """
    num_slots, max_depth = state.draft_tokens.shape
    conf = inputs.synthetic_conf if synthetic else state.draft_conf
    layout = fill(conf, state.proposal_len, inputs.active, num_rows=num_rows)
    slot = jnp.clip(layout.row_slot, 0, num_slots - 1)  # [B]; padding rows read slot N-1
    offset = layout.row_offset  # [B]
    draft_at = state.draft_tokens[slot, jnp.clip(offset - 1, 0, max_depth - 1)]
    row_token = jnp.where(offset == 0, state.last_token[slot], draft_at)  # [B]
    row_pos = state.seq_len[slot] + offset  # [B]

    out = target(row_token, row_pos, layout.row_slot, cache, aux_layers=aux_layers)
    # The token sampled at a row is for position row_pos + 1: the same key plain decoding
    # would use there, so the committed tokens are exactly the target's own.
    target_tokens = sample(out.logits, inputs.temperature[slot], inputs.top_k[slot],
                           inputs.top_p[slot], inputs.seed[slot], row_pos + 1)  # [B]
    accepted, out_tokens, num_new = verify(target_tokens, layout, state.draft_tokens)
    if synthetic:
        accepted, out_tokens, num_new = _synthetic_verify(target_tokens, layout,
                                                          inputs.synthetic_accept, max_depth)
    hidden = out.aux_hidden if out.aux_hidden is not None else jnp.zeros((num_rows, 1))
    done = commit(out_tokens, num_new, accepted, layout, state.seq_len, inputs.active,
                  inputs.stop_ids, inputs.remaining, hidden)
    stepped = inputs.active & layout.slot_valid
    state = state._replace(
        seq_len=done.new_seq_len,
        last_token=jnp.where(stepped, done.new_last_token, state.last_token),
        proposal_len=jnp.where(stepped, 0, state.proposal_len))  # consumed; drafting refills
    handoff = VerifyOutput(
        rows=DraftRows(token=row_token, next_token=target_tokens, hidden=out.aux_hidden,
                       position=row_pos, slot=layout.row_slot),
        tail_row=done.tail_row, bonus=done.new_last_token, new_seq_len=done.new_seq_len,
        stepped=stepped)
    result = SpecResult(out_tokens=out_tokens, num_emitted=done.num_emitted,
                        finished=done.finished, accepted=accepted, verified=layout.lengths,
                        stepped=stepped, confidence=state.draft_conf)
    return out.cache, state, handoff, result


def _synthetic_verify(target_tokens, layout, accept_full, max_depth):
    """Accepts each slot's profile-drawn prefix, cut to the drafts actually verified."""
    accepted = jnp.where(layout.slot_valid, jnp.minimum(accept_full, layout.lengths), 0)
    offsets = jnp.arange(max_depth + 1)  # [K+1]
    rows = jnp.clip(layout.row_start[:, None] + offsets[None, :], 0, target_tokens.shape[0] - 1)
    keep = layout.slot_valid[:, None] & (offsets[None, :] <= accepted[:, None])  # [N, K+1]
    out_tokens = jnp.where(keep, target_tokens[rows], -1)
    num_new = jnp.where(layout.slot_valid, accepted + 1, 0)
    return accepted.astype(jnp.int32), out_tokens.astype(jnp.int32), num_new.astype(jnp.int32)


def _draft_step(drafter: Drafter, d_leaves, dcache, state: SpecState, carry, stepped,
                target_embed, *, depth: int):
    """The drafter's `depth` tokens per stepped slot become the next proposal."""
    max_depth = state.draft_tokens.shape[1]
    dcache, proposal = drafter.draft(d_leaves, dcache, carry, depth=depth,
                                     target_embed=target_embed)
    pad = ((0, 0), (0, max_depth - depth))
    keep = stepped[:, None]
    state = state._replace(
        draft_tokens=jnp.where(keep, jnp.pad(proposal.tokens, pad), state.draft_tokens),
        draft_conf=jnp.where(keep, jnp.pad(proposal.confidence, pad), state.draft_conf),
        proposal_len=jnp.where(stepped, depth, state.proposal_len).astype(jnp.int32))
    return dcache, state


class SpecRunner:
    """Owns the device state and the compiled steps: prefill per row bucket, verify and the
    drafter's commit forward per verify bucket B, drafting per depth d."""

    def __init__(self, target: Qwen3, drafter: Drafter, *, num_slots: int, cache_len: int,
                 max_depth: int, prefill_buckets: tuple[int, ...],
                 verify_buckets: tuple[int, ...], depths: tuple[int, ...],
                 show_progress: bool = True, synthetic: bool = False):
        from flax import nnx

        self.num_slots = num_slots
        self.max_depth = max_depth
        self.cache_len = cache_len
        self.drafter = drafter
        graphdef, t_state = nnx.split(target)
        self._t_leaves, t_treedef = jax.tree.flatten(t_state)
        self._embed = target.embed[...]
        self.cache = target.new_cache(num_slots=num_slots, max_len=cache_len)
        self.dcache = drafter.new_cache(num_slots=num_slots, cache_len=cache_len)
        self.state = self.empty_state()
        merge = lambda leaves: nnx.merge(graphdef, jax.tree.unflatten(t_treedef, leaves))  # noqa: E731
        aux = drafter.aux_layers

        def prefill_step(t_leaves, d_leaves, cache, dcache, state, inputs, extras):
            return _prefill_step(merge(t_leaves), drafter, d_leaves, cache, dcache, state,
                                 inputs, extras)

        def verify_step(rows):
            def step(t_leaves, cache, state, inputs):
                return _verify_step(merge(t_leaves), aux, cache, state, inputs, num_rows=rows,
                                    synthetic=synthetic)
            return step

        def commit_step(d_leaves, dcache, handoff, embed):
            return drafter.commit(d_leaves, dcache, handoff.rows, tail_row=handoff.tail_row,
                                  bonus=handoff.bonus, new_seq_len=handoff.new_seq_len,
                                  stepped=handoff.stepped, target_embed=embed)

        def draft_step(depth):
            def step(d_leaves, dcache, state, carry, stepped, embed):
                return _draft_step(drafter, d_leaves, dcache, state, carry, stepped, embed,
                                   depth=depth)
            return step

        t_abs, d_abs = abstract(self._t_leaves), abstract(drafter.param_leaves)
        cache_abs, dcache_abs = abstract(self.cache), abstract(self.dcache)
        state_abs, embed_abs = abstract(self.state), abstract(self._embed)
        self.prefill_registry = BucketRegistry("prefill step", prefill_buckets)
        self.verify_registry = BucketRegistry("verify step", verify_buckets)
        self.commit_registry = BucketRegistry("draft commit", verify_buckets)
        self.draft_registry = BucketRegistry("draft step", depths)
        self.depths = self.draft_registry.sizes
        work = [("prefill", b) for b in self.prefill_registry.sizes]
        work += [("verify", b) for b in self.verify_registry.sizes]
        work += [("draft", d) for d in self.depths]
        carry_abs = None
        for kind, size in tqdm(work, desc="compiling speculative buckets",
                               disable=not show_progress, leave=False):
            if kind == "prefill":
                self.prefill_registry.compile(
                    size, prefill_step, t_abs, d_abs, cache_abs, dcache_abs, state_abs,
                    abstract(empty_step_inputs(size, num_slots)), abstract(self.empty_extras(size)),
                    donate_argnames=("cache", "dcache", "state"))
            elif kind == "verify":
                inputs_abs = abstract(self.empty_spec_inputs())
                self.verify_registry.compile(size, verify_step(size), t_abs, cache_abs, state_abs,
                                             inputs_abs, donate_argnames=("cache", "state"))
                handoff_abs = jax.eval_shape(verify_step(size), t_abs, cache_abs, state_abs,
                                             inputs_abs)[2]
                self.commit_registry.compile(size, commit_step, d_abs, dcache_abs, handoff_abs,
                                             embed_abs, donate_argnames=("dcache",))
                carry_abs = jax.eval_shape(commit_step, d_abs, dcache_abs, handoff_abs,
                                           embed_abs)[1]
            else:
                stepped_abs = jax.ShapeDtypeStruct((num_slots,), jnp.bool_)
                self.draft_registry.compile(size, draft_step(size), d_abs, dcache_abs, state_abs,
                                            carry_abs, stepped_abs, embed_abs,
                                            donate_argnames=("dcache", "state"))

    @property
    def compile_seconds(self) -> float:
        return sum(r.compile_seconds for r in (self.prefill_registry, self.verify_registry,
                                               self.commit_registry, self.draft_registry))

    def empty_state(self) -> SpecState:
        n, k = self.num_slots, self.max_depth
        return SpecState(seq_len=jnp.zeros((n,), jnp.int32), last_token=jnp.zeros((n,), jnp.int32),
                         draft_tokens=jnp.zeros((n, k), jnp.int32),
                         draft_conf=jnp.zeros((n, k), jnp.float32),
                         proposal_len=jnp.zeros((n,), jnp.int32))

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
                          remaining=np.zeros((n,), np.int32),
                          synthetic_accept=np.zeros((n,), np.int32),
                          synthetic_conf=np.zeros((n, self.max_depth), np.float32))

    def run_prefill(self, inputs: StepInputs, extras: PrefillExtras) -> jax.Array:
        rows = inputs.row_slot.shape[0]
        self.cache, self.dcache, self.state, new_tokens = self.prefill_registry(
            rows, self._t_leaves, self.drafter.param_leaves, self.cache, self.dcache,
            self.state, inputs, extras)
        return new_tokens

    def run_verify(self, inputs: SpecInputs, *, rows: int):
        self.cache, self.state, handoff, result = self.verify_registry(
            rows, self._t_leaves, self.cache, self.state, inputs)
        return handoff, result

    def run_commit(self, handoff: VerifyOutput, *, rows: int):
        self.dcache, carry = self.commit_registry(rows, self.drafter.param_leaves, self.dcache,
                                                  handoff, self._embed)
        return carry

    def run_draft(self, carry, stepped, *, depth: int) -> None:
        self.dcache, self.state = self.draft_registry(
            depth, self.drafter.param_leaves, self.dcache, self.state, carry, stepped,
            self._embed)

    def run_spec(self, inputs: SpecInputs, *, rows: int, depth: int) -> SpecResult:
        """Dispatches verify, the draft commit and drafting; returns the (device) results
        without waiting for them."""
        handoff, result = self.run_verify(inputs, rows=rows)
        carry = self.run_commit(handoff, rows=rows)
        self.run_draft(carry, handoff.stepped, depth=depth)
        return result
