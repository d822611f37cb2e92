"""The drafter interface the speculative step calls: pure functions over split parameters.

A drafter sees the target's verify rows as (token x_p, next token x_{p+1}, target features h_p,
position p, slot) - the next token of a verified row is the target's own token sampled there,
so it is known on the device right after verification - and returns the next proposal of each
slot that stepped: `depth` draft tokens (target vocabulary ids) with the drafter's top-1
probability for each (the confidence the fill and the planner use).

Two stages in two executables, so that neither holds device-side control flow (on a GPU a
`lax.cond` or a loop with a traced trip count reads a predicate back to the host, stalling
the dispatch until the device gets there): `commit` inside the verify step of each bucket B
writes the drafter's cache for the verified rows and keeps what drafting starts from, every
step; `draft` for a static depth d, one executable per depth, runs only when the planner
drafts. So the engine compiles |B| + |d| executables, not |B| x |d|, and the planner's floor
(depth 0) is the verify step alone.

A drafter whose commit is a forward through a model of its own (the draft LM: every layer's
K/V needs the layer below) would make the floor cost that forward more than a plain step.
Such a drafter `catches_up`: at the floor the verify step only `record`s the rows' tokens, and
before the next step that commits, `catch_up` runs its forward over the positions it missed
- the same rows the skipped commits would have written, in fewer and larger forwards, and
none at all while the floor lasts. Its cache is current again before it drafts, so
speculation resumes from a drafter that missed nothing (no TensorRT-LLM #16888 staleness).

Axis legend: T rows, N slots, F target feature width, d draft depth.
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ..sampling import Draw, ProposalSampling


class DraftRows(NamedTuple):
    token: jax.Array  # [T] int32: x_p, the row's input token
    next_token: jax.Array  # [T] int32: x_{p+1} (for verify rows: the target's token at the row)
    hidden: jax.Array | None  # [T, F] target features (the drafter's aux layers), or None
    position: jax.Array  # [T] int32: p
    slot: jax.Array  # [T] int32; padding rows = N (cache writes dropped)

    def prompt_length(self, length: jax.Array) -> jax.Array:
        """[N] each slot's known length after these prompt rows: a chunk's rows are its
        slot's positions up to the chunk's end; slots without rows keep `length` [N]."""
        n = length.shape[0]
        end = jnp.full((n + 1,), -1, jnp.int32).at[self.slot].max(self.position + 1)[:n]
        return jnp.where(end >= 0, end, length).astype(jnp.int32)

    def verified_length(self, length: jax.Array, tail_row: jax.Array) -> jax.Array:
        """[N] each slot's known length after these verify rows: through its tail row (its
        last accepted one, tail_row [N]); slots without rows keep `length` [N]."""
        n = length.shape[0]
        stepped = jnp.zeros((n + 1,), bool).at[self.slot].set(True)[:n]
        return jnp.where(stepped, self.position[tail_row] + 1, length).astype(jnp.int32)


class Proposal(NamedTuple):
    tokens: jax.Array  # [N, d] int32 target-vocabulary ids
    confidence: jax.Array  # [N, d] f32: the drafter's probability of its own token
    # [N] int32 drafts each slot really has (a lookup drafter may find fewer than the depth);
    # None: the whole depth
    length: jax.Array | None = None
    # The distribution each draft was drawn from, in support form (sampling.Draw; what
    # probabilistic verification tests against): [N, K, M] target ids (-1 unused) and
    # probabilities. None: each draft is deterministic given what the drafter has seen.
    q_ids: jax.Array | None = None
    q_probs: jax.Array | None = None


class Drafter(abc.ABC):
    """An NNX drafter split once into (graphdef, parameter leaves) for the jitted steps."""

    kind: str = "autoregressive"  # or "parallel" (block drafters such as DFlash)
    # A parallel drafter that cuts its block to the depth: the block's rows besides its d
    # drafts (so each depth is a cost of its own, and a dynamic engine chooses among them;
    # PlannerSpec.block_lead). None: it runs its whole block whatever it reads out.
    block_lead: int | None = None
    method: str = ""  # SpeculativeConfig.method it serves ("eagle3", "dflash", "draft_lm", "ngram")
    aux_layers: tuple[int, ...] = ()  # target features it reads (residual entering layer j)
    # Whether a draft run may propose fewer tokens than its depth (Proposal.length: a lookup
    # drafter finds no match, or a short one). Such a miss is the drafter's outcome, and the
    # planner's statistics must count it as rejected drafts, not leave the request out.
    short_proposals: bool = False
    # Whether a floor step may `record` instead of `commit`, the drafter's cache then behind
    # until `catch_up` (see the module docstring).
    catches_up: bool = False

    def __init__(self, module: nnx.Module):
        self.graphdef, state = nnx.split(module)
        self.param_leaves, self._treedef = jax.tree.flatten(state)

    def module(self, param_leaves) -> nnx.Module:
        """Rebuilds the module inside a jitted function."""
        return nnx.merge(self.graphdef, jax.tree.unflatten(self._treedef, param_leaves))

    @abc.abstractmethod
    def new_cache(self, *, num_slots: int, cache_len: int) -> Any:
        """The drafter's own per-slot cache pytree."""

    @abc.abstractmethod
    def prefill(self, param_leaves, cache, rows: DraftRows, *, target_embed: jax.Array) -> Any:
        """Writes the drafter cache for prompt rows; returns the new cache."""

    @abc.abstractmethod
    def commit(self, param_leaves, cache, rows: DraftRows, *, tail_row: jax.Array,
               target_embed: jax.Array) -> Any:
        """The drafter's cache writes for the B verify rows, plus what `draft` starts from at
        each slot's tail row (kept in the cache). tail_row [N]: the verify row of each slot's
        bonus token (its last accepted row). Returns the new cache."""

    def record(self, param_leaves, cache, rows: DraftRows) -> Any:
        """A floor step's part (drafters that `catches_up`): the verify rows' tokens kept for
        `catch_up`, no forward. Returns the new cache."""
        raise NotImplementedError(f"{type(self).__name__} does not catch up")

    def catch_up(self, param_leaves, cache, *, seq_len: jax.Array, window: int) -> Any:
        """The forward `record` skipped, for up to `window` (static) positions per slot from
        where its cache stops, and before `seq_len` [N] (the committed length); call it until
        it has covered the most positions any slot missed. Returns the new cache."""
        raise NotImplementedError(f"{type(self).__name__} does not catch up")

    @abc.abstractmethod
    def draft(self, param_leaves, cache, *, last_token: jax.Array, seq_len: jax.Array,
              drafting: jax.Array, depth: int, max_depth: int, target_embed: jax.Array,
              sampling: ProposalSampling | None = None) -> tuple[Any, Proposal]:
        """Drafts `depth` (static, 1..max_depth) tokens for each slot with `drafting` [N],
        after its bonus token last_token [N] at position seq_len [N] (the committed length);
        returns (cache, proposal [N, max_depth], zero past depth; see `chain`).

        sampling: None drafts the argmax; else each draft of a sampled request is drawn with
        sampling.draw_proposal (coupled to the target's own noise for exact match, or from q
        for probabilistic verification) and its distribution returned. A drafter that returns
        no distribution must draft deterministically given its inputs: its drafts are then
        point masses."""


def support(sampling: ProposalSampling | None) -> int:
    """M, the proposal distribution's entries per draft (0 without sampling)."""
    return 0 if sampling is None else sampling.support


def chain(step, carry, token: jax.Array, *, depth: int, max_depth: int, support: int = 0,
          first: Draw | None = None) -> tuple[Any, Proposal]:
    """Runs a recurrent drafter for a static `depth` (1 <= depth <= max_depth): a loop whose
    trip count the compiler knows, so the device runs it without asking the host.

    step(carry, token [N], k) -> (carry, Draw of [N]) drafts token k from the one before it
    (target ids). With `first` (a Draw) draft 0 is already known and the loop starts at k = 1
    from it; otherwise at k = 0 from `token`. Returns the final carry and the proposal
    [N, max_depth] (distributions [N, max_depth, support]), zero past `depth`.
    """
    if not 1 <= depth <= max_depth:
        raise ValueError(f"depth must be in [1, {max_depth}], got {depth}")
    n = token.shape[0]
    out = Draw(token=jnp.zeros((n, max_depth), jnp.int32),  # [N, K]
               conf=jnp.zeros((n, max_depth), jnp.float32),  # [N, K]
               q_ids=jnp.full((n, max_depth, support), -1, jnp.int32),  # [N, K, M]
               q_probs=jnp.zeros((n, max_depth, support), jnp.float32))

    def put(out: Draw, k, d: Draw) -> Draw:
        return Draw(*(o.at[:, k].set(x.astype(o.dtype)) for o, x in zip(out, d)))

    start = 0
    if first is not None:
        token, out, start = first.token, put(out, 0, first), 1

    def body(k, state):
        carry, token, out = state
        carry, d = step(carry, token, k)
        return carry, d.token, put(out, k, d)

    carry, _, out = jax.lax.fori_loop(start, depth, body, (carry, token, out))
    return carry, Proposal(out.token, out.conf, q_ids=out.q_ids, q_probs=out.q_probs)
