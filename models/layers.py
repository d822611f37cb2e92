"""Pure functions shared by the Qwen3 target and the Eagle3 drafter.

Axis legend used across models/: T flat token rows, H hidden, I intermediate, Q query heads,
G KV heads, D head dim, S cache length, N slots, L layers, V vocab.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from jax import lax


UNROLL_LAYERS_ENV = "LIGHTSPEC_UNROLL_LAYERS"


def layer_unroll(num_layers: int) -> int:
    """Layers per iteration of a model's layer scan, read when the forward is traced.

    LIGHTSPEC_UNROLL_LAYERS=1 unrolls the whole stack into one straight-line step; unset or 0
    keeps one layer per iteration (a loop: compile time does not grow with depth). On the
    H200 the unrolled Qwen3-0.6B-shaped step ran 13-17% faster on the device and compiled
    3.3x slower (BENCHMARKS.md, "Runs 9-11"; benchmarks/step_breakdown.py times both).
    """
    return num_layers if os.environ.get(UNROLL_LAYERS_ENV, "0") == "1" else 1


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


def over_row_tiles(fn, *rows: jax.Array, tile: int | None):
    """fn applied to `tile` rows at a time: each array in `rows` is [T, ...] on its leading axis,
    and so is each output of fn. None: fn(*rows), one call over all T rows.

    The batch-invariant mode (EngineConfig.batch_invariant). A matmul's summation order over
    its contraction depends on how many rows it multiplies (XLA and BLAS pick kernels and
    splits by shape), so a row's bf16 result can change with the batch around it. Here every
    call of fn sees the same [tile, ...] shapes, one `lax.map` iteration per tile, so a row's
    result depends on its own inputs alone, not on T nor its place among the rows. Rows are
    zero-padded to a multiple of `tile` (callers give padding rows a neutral meaning).
    """
    if tile is None:
        return fn(*rows)
    t = rows[0].shape[0]
    pad = -t % tile

    def tiled(x):  # [T, ...] -> [T'/tile, tile, ...]
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
        return x.reshape(-1, tile, *x.shape[1:])

    out = lax.map(lambda xs: fn(*xs), tuple(tiled(x) for x in rows))
    return jax.tree.map(lambda y: y.reshape(-1, *y.shape[2:])[:t], out)
