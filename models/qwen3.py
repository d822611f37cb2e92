"""The Qwen3 dense target in Flax NNX, run over flat token rows against a per-slot KV cache.

Architecture as in transformers `models/qwen3/modeling_qwen3.py`: pre-norm residual blocks,
per-head q_norm/k_norm applied after the head reshape and before RoPE, GQA, fp32 softmax, SwiGLU,
RMSNorm without an offset, tied or untied lm_head. Decoder layers are stored stacked on a leading
L axis and applied with `lax.scan`, so compile time does not grow with depth.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from lightspec_jax.pallas_kernels import verify_attention, verify_attention_reference

from .attention import write_kv
from .config import Qwen3Config
from .kv_cache import KVCache
from .layers import apply_rope, layer_unroll, over_row_tiles, rms_norm, rope_cos_sin, swiglu

LAYER_PARAM_NAMES = ("input_norm", "q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm",
                     "post_norm", "gate_proj", "up_proj", "down_proj")


def layer_param_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Stacked per-layer parameters: name -> shape without the leading [L] axis."""
    h, i, q, g, d = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                     cfg.head_dim)
    return {
        "input_norm": (h,),
        "q_proj": (h, q, d),
        "k_proj": (h, g, d),
        "v_proj": (h, g, d),
        "o_proj": (q, d, h),
        "q_norm": (d,),
        "k_norm": (d,),
        "post_norm": (h,),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


class Qwen3Output(NamedTuple):
    logits: jax.Array  # [R, V] fp32, R = len(logits_rows) or T
    aux_hidden: jax.Array | None  # [T, A*H]: residual stream entering each aux layer, concatenated
    cache: KVCache


class Qwen3Layers(nnx.Module):
    """All decoder layers, each parameter stacked on a leading [L] axis."""

    def __init__(self, cfg: Qwen3Config, *, dtype, rngs: nnx.Rngs):
        for name, shape in layer_param_shapes(cfg).items():
            full = (cfg.num_layers, *shape)
            if name.endswith("norm"):
                value = jnp.ones(full, dtype)
            else:
                value = (0.02 * jax.random.normal(rngs.params(), full, jnp.float32)).astype(dtype)
            setattr(self, name, nnx.Param(value))

    def stacked(self) -> dict[str, jax.Array]:
        return {name: getattr(self, name)[...] for name in LAYER_PARAM_NAMES}


class Qwen3(nnx.Module):
    def __init__(self, cfg: Qwen3Config, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = cfg
        self.embed = nnx.Param(
            (0.02 * jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.hidden_size))).astype(dtype))
        self.layers = Qwen3Layers(cfg, dtype=dtype, rngs=rngs)
        self.norm = nnx.Param(jnp.ones((cfg.hidden_size,), dtype))
        self.lm_head = None if cfg.tie_word_embeddings else nnx.Param(
            (0.02 * jax.random.normal(rngs.params(), (cfg.hidden_size, cfg.vocab_size))).astype(dtype))

    @property
    def dtype(self):
        return self.embed.get_value().dtype

    def new_cache(self, *, num_slots: int, max_len: int, dtype=None,
                  num_kv_heads: int | None = None) -> KVCache:
        """num_kv_heads: for K/V projections whose heads were repeated (tensor parallelism
        over more devices than KV heads, engine/sharding.py); the forward reads G from the
        projections, so the cache must match them."""
        cfg = self.config
        return KVCache.init(num_layers=cfg.num_layers, num_slots=num_slots, max_len=max_len,
                            num_kv_heads=num_kv_heads or cfg.num_kv_heads, head_dim=cfg.head_dim,
                            dtype=dtype or self.dtype)

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        return self.embed[...][tokens]  # [T, H]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Final norm + lm_head (or E^T when tied): hidden [R, H] -> fp32 logits [R, V]."""
        x = rms_norm(hidden, self.norm[...], self.config.rms_norm_eps)
        if self.lm_head is None:
            return jnp.einsum("rh,vh->rv", x, self.embed[...], preferred_element_type=jnp.float32)
        return jnp.einsum("rh,hv->rv", x, self.lm_head[...], preferred_element_type=jnp.float32)

    def __call__(self, tokens: jax.Array, positions: jax.Array, slots: jax.Array, cache: KVCache,
                 *, logits_rows: jax.Array | None = None,
                 aux_layers: tuple[int, ...] = (), row_tile: int | None = None) -> Qwen3Output:
        """One forward over flat rows.

        tokens, positions, slots: [T] int32 (padding rows: slot = N, dropped from the cache).
        logits_rows: optional [R] row indices whose logits are wanted (e.g. the last prompt row).
        aux_layers: static layer ids j; returns the residual stream entering layer j (HF
        `hidden_states[j]`, j = 0 is the embeddings; j = L is the final-norm output, as in HF).
        row_tile: static; computes every row-wise stage `row_tile` rows at a time
        (layers.over_row_tiles), so each row's logits are bitwise the same whatever the rows
        around it: the batch-invariant mode. Attention then reads the cache in fixed blocks
        with the jnp reference on every backend. None: all rows at once (the default).
        """
        cfg = self.config
        num_layers = cfg.num_layers
        for j in aux_layers:
            if not 0 <= j <= num_layers:
                raise ValueError(f"aux layer {j} outside [0, {num_layers}] for a {num_layers}-layer model")
        num_rows = tokens.shape[0]
        if row_tile is not None:  # whole tiles; padding rows (slot N) write nothing
            pad = -num_rows % row_tile
            tokens, positions = jnp.pad(tokens, (0, pad)), jnp.pad(positions, (0, pad))
            slots = jnp.pad(slots, (0, pad), constant_values=cache.num_slots)
        x = self.embed_tokens(tokens)  # [T, H]
        cos, sin = over_row_tiles(  # [T, D] each
            lambda pos: rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta, x.dtype), positions,
            tile=row_tile)

        # Row a of aux_acc collects collected[a]; layers that are not collected write to a
        # spare last row, so the per-layer update is one unconditional dynamic_update_slice.
        collected = sorted({j for j in aux_layers if j < num_layers})
        aux_index = [len(collected)] * num_layers
        for a, j in enumerate(collected):
            aux_index[j] = a
        aux_acc = jnp.zeros((len(collected) + 1, *x.shape), x.dtype)  # [A+1, T, H]

        def layer_step(carry, xs):
            x, ck, cv, aux_acc = carry
            p, layer, aux_slot = xs
            aux_acc = jax.lax.dynamic_update_index_in_dim(aux_acc, x, aux_slot, 0)
            x, ck, cv = _decoder_layer(cfg, p, layer, x, ck, cv, slots, positions, cos, sin,
                                       row_tile=row_tile)
            return (x, ck, cv, aux_acc), None

        xs = (self.layers.stacked(), jnp.arange(num_layers), jnp.asarray(aux_index, jnp.int32))
        (x, ck, cv, aux_acc), _ = jax.lax.scan(layer_step, (x, cache.k, cache.v, aux_acc), xs,
                                               unroll=layer_unroll(num_layers))

        aux_hidden = None
        if aux_layers:
            parts = [rms_norm(x, self.norm[...], cfg.rms_norm_eps) if j == num_layers
                     else aux_acc[collected.index(j)] for j in aux_layers]
            aux_hidden = jnp.concatenate(parts, axis=-1)[:num_rows]  # [T, A*H]
        rows = x[:num_rows] if logits_rows is None else x[logits_rows]
        logits = over_row_tiles(self.logits, rows, tile=row_tile)
        return Qwen3Output(logits, aux_hidden, KVCache(ck, cv))


def _decoder_layer(cfg: Qwen3Config, p: dict[str, jax.Array], layer: jax.Array, x: jax.Array,
                   ck: jax.Array, cv: jax.Array, slots: jax.Array, positions: jax.Array,
                   cos: jax.Array, sin: jax.Array, visible: jax.Array | None = None,
                   row_tile: int | None = None):
    """One pre-norm block on rows x [T, H]; writes this layer's K/V then attends.

    visible: [T] the last cache position each row attends to (default: its own, causal); the
    DFlash drafter passes its block's last position so the block attends non-causally.
    row_tile: see Qwen3.__call__; the K/V of every tile are written before any tile attends,
    since one request's rows may sit in several tiles."""
    eps = cfg.rms_norm_eps

    def project(x, cos, sin):  # [T, H], [T, D], [T, D] -> q [T, Q, D], k, v [T, G, D]
        h = rms_norm(x, p["input_norm"], eps)
        q = jnp.einsum("th,hqd->tqd", h, p["q_proj"])
        k = jnp.einsum("th,hgd->tgd", h, p["k_proj"])
        v = jnp.einsum("th,hgd->tgd", h, p["v_proj"])
        q = apply_rope(rms_norm(q, p["q_norm"], eps), cos, sin)
        k = apply_rope(rms_norm(k, p["k_norm"], eps), cos, sin)
        return q, k, v

    def attend(x, q, slots, seen):  # [T, H], [T, Q, D], [T], [T] -> x [T, H]
        if row_tile is None:
            attn = verify_attention(q, ck, cv, slots, seen, layer=layer)  # [T, Q, D]
        else:  # fixed KV blocks, whatever the cache length: a fixed summation order
            attn = verify_attention_reference(q, ck, cv, slots, seen, layer=layer,
                                              fixed_block=True)
        x = x + jnp.einsum("tqd,qdh->th", attn, p["o_proj"])
        h = rms_norm(x, p["post_norm"], eps)
        return x + swiglu(h, p["gate_proj"], p["up_proj"], p["down_proj"])

    q, k, v = over_row_tiles(project, x, cos, sin, tile=row_tile)
    ck, cv = write_kv(ck, cv, layer, slots, positions, k, v)
    seen = positions if visible is None else visible
    x = over_row_tiles(attend, x, q, slots, seen, tile=row_tile)
    return x, ck, cv
