"""Pure functions shared by the Qwen3 target and the Eagle3 drafter.

Axis legend used across models/: T flat token rows, H hidden, I intermediate, Q query heads,
G KV heads, D head dim, S cache length, N slots, L layers, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Qwen3/Llama RMSNorm: normalise in fp32, cast back, then scale (no `1 + w` offset)."""
    dtype = x.dtype
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return x32.astype(dtype) * weight.astype(dtype)


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float, dtype) -> tuple[jax.Array, jax.Array]:
    """cos/sin [T, D] for absolute 0-based positions [T].

    inv_freq_i = theta^(-2i/D) and the angles repeat as concat(freqs, freqs) (NeoX layout), as in
    transformers `models/qwen3/modeling_qwen3.py`; computed in fp32 and cast to the activation
    dtype, which is what bf16 parity needs.
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    angles = jnp.concatenate([freqs, freqs], axis=-1)  # [T, D]
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [T, heads, D] rotated with rotate_half: x*cos + [-x2, x1]*sin."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    """down(silu(x @ gate) * (x @ up)); x [T, H], gate/up [H, I], down [I, H]."""
    return (jax.nn.silu(x @ gate) * (x @ up)) @ down
