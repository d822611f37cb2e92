"""Attention of flat token rows against the per-slot KV cache (the XLA path).

Every row carries (slot, position). A step first writes each row's K/V into its slot at its
position, then each row attends to its own slot's cache up to and including its position. Rows of
one request written in the same step therefore see each other causally, so this one function
serves prefill chunks, plain decode and speculative verification alike.

Padding rows use slot = N (out of range): their writes are dropped and their reads are clipped to
a real slot, so they produce finite garbage that callers ignore.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite, so padding rows stay NaN-free


def write_kv(cache_k: jax.Array, cache_v: jax.Array, layer: jax.Array, slots: jax.Array,
             positions: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Scatter k/v [T, G, D] into cache [L, N, S, G, D] at (layer, slot, position) per row."""
    cache_k = cache_k.at[layer, slots, positions].set(k.astype(cache_k.dtype), mode="drop")
    cache_v = cache_v.at[layer, slots, positions].set(v.astype(cache_v.dtype), mode="drop")
    return cache_k, cache_v


def cached_attention(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array, layer: jax.Array,
                     slots: jax.Array, positions: jax.Array) -> jax.Array:
    """q [T, Q, D] against layer `layer` of cache [L, N, S, G, D] -> [T, Q, D].

    Softmax in fp32 with scores scaled by D^-0.5; GQA maps query head j to KV head j // (Q/G).
    This path gathers each row's whole slot strip ([T, S, G, D]); the GPU kernel reads each
    request's KV once for all its rows instead.
    """
    num_rows, num_q, head_dim = q.shape
    num_kv = cache_k.shape[3]
    k = cache_k[layer, slots]  # [T, S, G, D] (slots clipped for padding rows)
    v = cache_v[layer, slots]  # [T, S, G, D]
    qg = q.reshape(num_rows, num_kv, num_q // num_kv, head_dim)  # [T, G, Q/G, D]
    scores = jnp.einsum("tgqd,tsgd->tgqs", qg, k, preferred_element_type=jnp.float32)
    scores = scores * (head_dim ** -0.5)
    visible = jnp.arange(cache_k.shape[2])[None, :] <= positions[:, None]  # [T, S]
    scores = jnp.where(visible[:, None, None, :], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # [T, G, Q/G, S]
    out = jnp.einsum("tgqs,tsgd->tgqd", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(num_rows, num_q, head_dim).astype(q.dtype)
