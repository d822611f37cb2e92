"""The drafter interface the speculative step calls: pure functions over split parameters.

A drafter sees the target's verify rows as (token x_p, next token x_{p+1}, target features h_p,
position p, slot) - the next token of a verified row is the target's own token sampled there,
so it is known on the device right after verification - and returns the next proposal of each
slot that stepped: `depth` draft tokens (target vocabulary ids) with the drafter's top-1
probability for each (the confidence the fill and the planner use).

Two stages, both inside the engine's one decode executable per verify bucket B: `commit`
over the B verified rows, then `draft` for a runtime depth d (a bounded loop), so the engine
compiles |B| executables, not |B| x |d|. At depth 0 (the planner's floor) both give way to
`keep_current`, the commit's cache writes alone.

Axis legend: T rows, N slots, F target feature width, d draft depth.
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx


class DraftRows(NamedTuple):
    token: jax.Array  # [T] int32: x_p, the row's input token
    next_token: jax.Array  # [T] int32: x_{p+1} (for verify rows: the target's token at the row)
    hidden: jax.Array | None  # [T, F] target features (the drafter's aux layers), or None
    position: jax.Array  # [T] int32: p
    slot: jax.Array  # [T] int32; padding rows = N (cache writes dropped)


class Proposal(NamedTuple):
    tokens: jax.Array  # [N, d] int32 target-vocabulary ids
    confidence: jax.Array  # [N, d] f32: the drafter's probability of its own token


class Drafter(abc.ABC):
    """An NNX drafter split once into (graphdef, parameter leaves) for the jitted steps."""

    kind: str = "autoregressive"  # or "parallel" (block drafters such as DFlash)
    aux_layers: tuple[int, ...] = ()  # target features it reads (residual entering layer j)

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
               bonus: jax.Array, new_seq_len: jax.Array, stepped: jax.Array,
               target_embed: jax.Array) -> tuple[Any, Any]:
        """Commit forward over the verify rows; returns (cache, carry) for `draft`.

        tail_row [N]: the verify row of each slot's bonus token (its last accepted row);
        bonus [N]: the bonus token, the slot's new last token, at position new_seq_len [N];
        stepped [N]: slots that verified this step (others' drafts are ignored). Compiled per
        verify bucket B; `carry` holds whatever per-slot state drafting continues from.
        """

    @abc.abstractmethod
    def keep_current(self, param_leaves, cache, rows: DraftRows, *,
                     target_embed: jax.Array) -> Any:
        """The cache writes of `commit` over the verify rows, without drafting: the step at
        the planner's floor (draft depth 0) keeps the drafter's cache exactly as a drafting
        step would, so speculation resumes from a current drafter. Returns the new cache."""

    @abc.abstractmethod
    def draft(self, param_leaves, cache, carry, *, depth: jax.Array, max_depth: int,
              target_embed: jax.Array) -> tuple[Any, Proposal]:
        """Drafts `depth` (a traced scalar, 0..max_depth) tokens per slot from `carry`;
        returns the proposal [N, max_depth] (see `chain`)."""


def top1(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Greedy draft token and its softmax probability from logits [R, V]."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return token, jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0]


def chain(step, carry, token: jax.Array, *, depth: jax.Array, max_depth: int,
          first: tuple[jax.Array, jax.Array] | None = None) -> tuple[Any, Proposal]:
    """Runs a recurrent drafter for a runtime `depth` (0 <= depth <= max_depth) in a bounded
    loop: one executable serves every depth and its cost follows the depth actually run.

    step(carry, token [N], k) -> (carry, next [N], conf [N]) drafts token k from the one
    before it. With `first` = (tokens [N], conf [N]) draft 0 is already known (Eagle3 gets it
    from its commit forward) and the loop starts at k = 1 from it; otherwise at k = 0 from
    `token`. Returns the final carry and the proposal [N, max_depth], zero past `depth`.
    """
    n = token.shape[0]
    tokens = jnp.zeros((n, max_depth), jnp.int32)  # [N, K]
    conf = jnp.zeros((n, max_depth), jnp.float32)  # [N, K]
    start = 0
    if first is not None:
        token = first[0]
        tokens, conf = tokens.at[:, 0].set(first[0]), conf.at[:, 0].set(first[1])
        start = 1

    def body(k, state):
        carry, token, tokens, conf = state
        carry, nxt, c = step(carry, token, k)
        return (carry, nxt, tokens.at[:, k].set(nxt),
                conf.at[:, k].set(c.astype(jnp.float32)))

    carry, _, tokens, conf = jax.lax.fori_loop(start, depth, body, (carry, token, tokens, conf))
    keep = jnp.arange(max_depth)[None, :] < depth  # [1, K]
    return carry, Proposal(jnp.where(keep, tokens, 0), jnp.where(keep, conf, 0.0))
