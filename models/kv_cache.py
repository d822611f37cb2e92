"""Per-slot KV cache: one contiguous [S] strip per request slot and layer.

A slot's rows at positions < seq_len hold committed K/V; everything beyond is stale and masked
by position, so rejecting draft tokens never copies anything: the owner just lowers seq_len and
the next step overwrites the stale entries.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    k: jax.Array  # [L, N, S, G, D]
    v: jax.Array  # [L, N, S, G, D]

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @classmethod
    def init(cls, *, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
             head_dim: int, dtype=jnp.float32) -> "KVCache":
        shape = (num_layers, num_slots, max_len, num_kv_heads, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    @classmethod
    def abstract(cls, *, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
                 head_dim: int, dtype=jnp.float32) -> "KVCache":
        shape = jax.ShapeDtypeStruct((num_layers, num_slots, max_len, num_kv_heads, head_dim), dtype)
        return cls(shape, shape)
