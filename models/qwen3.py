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

from lightspec_jax.pallas_kernels import verify_attention

from .attention import write_kv
from .config import Qwen3Config
from .kv_cache import KVCache
from .layers import apply_rope, rms_norm, rope_cos_sin, swiglu

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
                 aux_layers: tuple[int, ...] = ()) -> Qwen3Output:
        """One forward over flat rows.

        tokens, positions, slots: [T] int32 (padding rows: slot = N, dropped from the cache).
        logits_rows: optional [R] row indices whose logits are wanted (e.g. the last prompt row).
        aux_layers: static layer ids j; returns the residual stream entering layer j (HF
        `hidden_states[j]`, j = 0 is the embeddings; j = L is the final-norm output, as in HF).
        """
        cfg = self.config
        num_layers = cfg.num_layers
        for j in aux_layers:
            if not 0 <= j <= num_layers:
                raise ValueError(f"aux layer {j} outside [0, {num_layers}] for a {num_layers}-layer model")
        x = self.embed_tokens(tokens)  # [T, H]
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, x.dtype)  # [T, D]

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
            x, ck, cv = _decoder_layer(cfg, p, layer, x, ck, cv, slots, positions, cos, sin)
            return (x, ck, cv, aux_acc), None

        xs = (self.layers.stacked(), jnp.arange(num_layers), jnp.asarray(aux_index, jnp.int32))
        (x, ck, cv, aux_acc), _ = jax.lax.scan(layer_step, (x, cache.k, cache.v, aux_acc), xs)

        aux_hidden = None
        if aux_layers:
            parts = [rms_norm(x, self.norm[...], cfg.rms_norm_eps) if j == num_layers
                     else aux_acc[collected.index(j)] for j in aux_layers]
            aux_hidden = jnp.concatenate(parts, axis=-1)  # [T, A*H]
        rows = x if logits_rows is None else x[logits_rows]
        return Qwen3Output(self.logits(rows), aux_hidden, KVCache(ck, cv))


def _decoder_layer(cfg: Qwen3Config, p: dict[str, jax.Array], layer: jax.Array, x: jax.Array,
                   ck: jax.Array, cv: jax.Array, slots: jax.Array, positions: jax.Array,
                   cos: jax.Array, sin: jax.Array, visible: jax.Array | None = None):
    """One pre-norm block on rows x [T, H]; writes this layer's K/V then attends.

    visible: [T] the last cache position each row attends to (default: its own, causal); the
    DFlash drafter passes its block's last position so the block attends non-causally."""
    eps = cfg.rms_norm_eps
    h = rms_norm(x, p["input_norm"], eps)
    q = jnp.einsum("th,hqd->tqd", h, p["q_proj"])  # [T, Q, D]
    k = jnp.einsum("th,hgd->tgd", h, p["k_proj"])  # [T, G, D]
    v = jnp.einsum("th,hgd->tgd", h, p["v_proj"])  # [T, G, D]
    q = apply_rope(rms_norm(q, p["q_norm"], eps), cos, sin)
    k = apply_rope(rms_norm(k, p["k_norm"], eps), cos, sin)
    ck, cv = write_kv(ck, cv, layer, slots, positions, k, v)
    attn = verify_attention(q, ck, cv, slots, positions if visible is None else visible,
                            layer=layer)  # [T, Q, D]
    x = x + jnp.einsum("tqd,qdh->th", attn, p["o_proj"])
    h = rms_norm(x, p["post_norm"], eps)
    x = x + swiglu(h, p["gate_proj"], p["up_proj"], p["down_proj"])
    return x, ck, cv
