"""Attention of flat token rows against the per-slot KV cache (the XLA path).

Every row carries (slot, position). A step first writes each row's K/V into its slot at its
position, then each row attends to its own slot's cache up to and including its position. Rows of
one request written in the same step therefore see each other causally, so this one function
serves prefill chunks, plain decode and speculative verification alike.

Padding rows use slot = N (out of range): their writes are dropped and their reads are clipped to
a real slot, so they produce finite garbage that callers ignore.

On a GPU backend `cached_attention` runs the Pallas kernel `pallas_kernels.verify_attention`
instead (same contract; padding rows give zeros); everywhere else this XLA path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lightspec_jax.pallas_kernels import verify_attention
from lightspec_jax.pallas_kernels._backend import use_pallas

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite, so padding rows stay NaN-free


def write_kv(cache_k: jax.Array, cache_v: jax.Array, layer: jax.Array, slots: jax.Array,
             positions: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Scatter k/v [T, G, D] into cache [L, N, S, G, D] at (layer, slot, position) per row."""
    cache_k = cache_k.at[layer, slots, positions].set(k.astype(cache_k.dtype), mode="drop")
    cache_v = cache_v.at[layer, slots, positions].set(v.astype(cache_v.dtype), mode="drop")
    return cache_k, cache_v


def cached_attention(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array, layer: jax.Array,
                     slots: jax.Array, positions: jax.Array, *, block: int = 128) -> jax.Array:
    """q [T, Q, D] against layer `layer` of cache [L, N, S, G, D] -> [T, Q, D].

    Scores are scaled by D^-0.5 and the softmax runs in fp32; GQA maps query head j to KV head
    j // (Q/G). The cache is read in blocks of `block` positions with an online softmax, and
    only up to the largest row position: the cost follows the live context, not the cache
    length. Each row gathers its own slot's block, so a request's KV is read once per row; the
    GPU kernel reads it once per request instead.
    """
    if use_pallas(None, op="verify_attention"):
        # The whole [L, ...] cache plus the layer index: a cache_k[layer] slice inside the
        # layer scan would be materialised as a copy of the layer's cache for the custom call.
        return verify_attention(q, cache_k, cache_v, slots, positions, layer=layer)
    num_rows, num_q, head_dim = q.shape
    max_len, num_kv = cache_k.shape[2], cache_k.shape[3]
    if max_len % block:
        block = max_len  # one block; the engine sizes caches as a multiple of the block
    qg = q.reshape(num_rows, num_kv, num_q // num_kv, head_dim)  # [T, G, Q/G, D]
    offsets = jnp.arange(block)  # [blk]

    def read_block(b, carry):
        running_max, denom, acc = carry  # [T, G, Q/G], [T, G, Q/G], [T, G, Q/G, D] fp32
        key_pos = b * block + offsets  # [blk]
        kb = cache_k[layer, slots[:, None], key_pos[None, :]]  # [T, blk, G, D]
        vb = cache_v[layer, slots[:, None], key_pos[None, :]]  # [T, blk, G, D]
        scores = jnp.einsum("tgqd,tsgd->tgqs", qg, kb, preferred_element_type=jnp.float32)
        scores = scores * (head_dim ** -0.5)
        visible = key_pos[None, :] <= positions[:, None]  # [T, blk]
        scores = jnp.where(visible[:, None, None, :], scores, _MASK_VALUE)
        # Block 0 always holds position 0, so running_max is a real score after it and fully
        # masked later blocks contribute exp(mask - max) = 0.
        new_max = jnp.maximum(running_max, scores.max(axis=-1))
        probs = jnp.exp(scores - new_max[..., None])  # [T, G, Q/G, blk]
        correction = jnp.exp(running_max - new_max)
        denom = denom * correction + probs.sum(axis=-1)
        acc = acc * correction[..., None] + jnp.einsum(
            "tgqs,tsgd->tgqd", probs.astype(vb.dtype), vb, preferred_element_type=jnp.float32)
        return new_max, denom, acc

    stats_shape = (num_rows, num_kv, num_q // num_kv)
    init = (jnp.full(stats_shape, _MASK_VALUE, jnp.float32), jnp.zeros(stats_shape, jnp.float32),
            jnp.zeros((*stats_shape, head_dim), jnp.float32))
    num_blocks = jnp.max(positions) // block + 1
    _, denom, acc = jax.lax.fori_loop(0, num_blocks, read_block, init)
    out = acc / denom[..., None]
    return out.reshape(num_rows, num_q, head_dim).astype(q.dtype)
