"""The drafter interface the speculative step calls: pure functions over split parameters.

A drafter sees the target's verify rows as (token x_p, next token x_{p+1}, target features h_p,
position p, slot) - the next token of a verified row is the target's own token sampled there,
so it is known on the device right after verification - and returns the next proposal of each
slot that stepped: `depth` draft tokens (target vocabulary ids) with the drafter's top-1
probability for each (the confidence the fill and the planner use).

Two stages, compiled apart: `commit` depends on the verify bucket B, `draft` on the depth d,
so an engine compiles |B| + |d| executables instead of |B| x |d|.

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
    def draft(self, param_leaves, cache, carry, *, depth: int,
              target_embed: jax.Array) -> tuple[Any, Proposal]:
        """Drafts `depth` tokens per slot from `carry`; compiled per depth."""


def top1(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Greedy draft token and its softmax probability from logits [R, V]."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return token, jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0]


def chain(step, carry, first: tuple[jax.Array, jax.Array], depth: int) -> tuple[Any, Proposal]:
    """Runs `depth - 1` recurrent draft steps after the first token (a scan: compile time does
    not grow with depth). step(carry, tokens [N], k) -> (carry, tokens [N], conf [N]) drafts
    token k+1 from token k; returns the final carry and the proposal [N, depth]."""
    tokens, conf = first
    if depth == 1:
        return carry, Proposal(tokens[:, None], conf[:, None])

    def body(state, k):
        carry, token = state
        carry, nxt, c = step(carry, token, k)
        return (carry, nxt), (nxt, c)

    (carry, _), (rest, rest_conf) = jax.lax.scan(body, (carry, tokens), jnp.arange(1, depth))
    return carry, Proposal(jnp.concatenate([tokens[:, None], rest.T], axis=1),
                           jnp.concatenate([conf[:, None], rest_conf.T], axis=1))
