"""Attention of flat token rows against the per-slot KV cache.

Every row carries (slot, position). A step first writes each row's K/V into its slot at its
position (`write_kv`), then each row attends to its own slot's cache up to and including its
position (`pallas_kernels.verify_attention`: the Pallas kernel on a GPU, its blockwise jnp
reference elsewhere). Rows of one request written in the same step therefore see each other
causally, so one layer body serves prefill chunks, plain decode and speculative verification.

Padding rows use slot = N (out of range): their writes are dropped here, and the attention op
gives them finite values that callers ignore.
"""

from __future__ import annotations

import jax


def write_kv(cache_k: jax.Array, cache_v: jax.Array, layer: jax.Array, slots: jax.Array,
             positions: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Scatter k/v [T, G, D] into cache [L, N, S, G, D] at (layer, slot, position) per row."""
    cache_k = cache_k.at[layer, slots, positions].set(k.astype(cache_k.dtype), mode="drop")
    cache_v = cache_v.at[layer, slots, positions].set(v.astype(cache_v.dtype), mode="drop")
    return cache_k, cache_v
