"""Token sampling on the device: greedy, temperature, top-k, top-p, per-request seeds.

Everything is per row, so requests with different parameters share one batch, and nothing
syncs with the host: what a batch needs (argmax only, a draw, or a draw after top-k/top-p) is a
static `SampleMode` the host picks from its requests' parameters, not a device-side branch -
on a GPU a `lax.cond` reads its predicate back to the host, which stalls the dispatch of the
whole step until the device reaches it. The random key of a row is derived from (request seed, position of the
token being sampled): the same request samples the same token at the same position whatever
it is batched with, and a speculative verify row samples exactly the token that plain decoding
would have sampled there, which keeps exact-match verification lossless at any temperature.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp


class SampleMode(enum.IntEnum):
    """What a batch's rows need, in increasing cost; a mode serves every row of a lower one
    with the same token (a greedy row is its argmax in every mode, filtering keeps every token
    of a row with top_k = 0 and top_p = 1)."""

    GREEDY = 0  # every row greedy: argmax only
    DRAW = 1  # some row samples at a temperature, none filters
    FILTER = 2  # some row samples with top-k or top-p


def _sortable_key(x: jax.Array) -> jax.Array:
    """f32 -> uint32 with the same order (-0.0 folded onto +0.0 so equal values tie)."""
    x = jnp.where(x == 0, 0.0, x)
    i = jax.lax.bitcast_convert_type(x, jnp.int32)
    i = jnp.where(i < 0, i ^ jnp.int32(0x7FFFFFFF), i)
    return jax.lax.bitcast_convert_type(i, jnp.uint32) ^ jnp.uint32(0x80000000)


def _largest_threshold(keys: jax.Array, weights: jax.Array, target: jax.Array) -> jax.Array:
    """Per row, the largest key t with sum(weights[keys >= t]) >= target, found bit by bit.

    keys [R, V] uint32, weights [R, V] >= 0, target [R] -> [R] uint32 (0 when none reaches it).
    The weighted count only changes at actual keys, so t is always one of the row's keys. 32
    masked reductions over [R, V] replace a full sort, which XLA on CPU does slowly.
    """
    def add_bit(bit, threshold):
        trial = threshold | (jnp.uint32(1) << (31 - bit).astype(jnp.uint32))
        mass = jnp.sum(jnp.where(keys >= trial[:, None], weights, 0), axis=-1)
        return jnp.where(mass >= target, trial, threshold)

    return jax.lax.fori_loop(0, 32, add_bit, jnp.zeros(keys.shape[:1], jnp.uint32))


def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Masks logits [R, V] outside each row's top-k and then top-p set with -inf.

    top_k [R] int32 (0 = off), top_p [R] f32 (1 = off). The order follows transformers'
    TopKLogitsWarper then TopPLogitsWarper; top-p keeps the smallest most-likely-first set whose
    mass reaches top_p (always at least the top token). Tokens tied with a threshold are kept
    (transformers breaks such ties by sort position instead).
    """
    keys = _sortable_key(logits)  # [R, V]
    k_threshold = _largest_threshold(keys, jnp.ones_like(logits), top_k.astype(jnp.float32))
    in_k = keys >= jnp.where(top_k > 0, k_threshold, 0)[:, None]
    probs = jax.nn.softmax(jnp.where(in_k, logits, -jnp.inf), axis=-1)  # [R, V]
    p_threshold = _largest_threshold(keys, probs, top_p)
    keep = in_k & (keys >= jnp.where(top_p < 1.0, p_threshold, 0)[:, None])
    return jnp.where(keep, logits, -jnp.inf)


def row_keys(seed: jax.Array, position: jax.Array) -> jax.Array:
    """One PRNG key per row from (seed [R] uint32, position [R] int32)."""
    base = jax.random.key(0)
    return jax.vmap(lambda s, p: jax.random.fold_in(jax.random.fold_in(base, s), p))(seed, position)


def sample(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
           seed: jax.Array, position: jax.Array, mode: SampleMode = SampleMode.FILTER
           ) -> jax.Array:
    """Draws one token per row of logits [R, V] (fp32) -> [R] int32.

    temperature [R] (0 = greedy argmax), top_k [R], top_p [R], seed [R] uint32, position [R]:
    the sequence position of the token being sampled (for the key). mode (static): the
    cheapest SampleMode that covers every row that matters (the default covers all).
    """
    argmax = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if mode == SampleMode.GREEDY:
        return argmax
    greedy = temperature <= 0.0
    scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
    if mode == SampleMode.FILTER:
        scaled = filter_logits(scaled, top_k, top_p)
    drawn = jax.vmap(jax.random.categorical)(row_keys(seed, position), scaled)
    return jnp.where(greedy, argmax, drawn).astype(jnp.int32)
