"""The Eagle3 drafter in Flax NNX: one decoder layer over (token embedding, target features).

Architecture as in reference/checkpoint-formats.md §2.1 (EAGLE `eagle/model/cnets.py`, vLLM and
SGLang `llama_eagle3.py`, speculators `models/eagle3/`): target features from A layers are
projected by `fc` to H; the layer's attention reads concat(input_layernorm(embed(token)),
hidden_norm(x)) [2H]; the residual is x itself; the pre-norm output r is carried to the next
draft step, where it replaces fc(features). Logits cover the draft vocab Vd, mapped back to
target ids by the `d2t` offsets.

Axis legend (as in layers.py): T flat rows, H hidden, Ht target hidden, A aux layers, I
intermediate, Q/G query/KV heads, D head dim, V target vocab, Vd draft vocab.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from lightspec_jax.pallas_kernels import verify_attention

from .attention import write_kv
from .config import ConfigError, Qwen3Config, check_attention_fields
from .kv_cache import KVCache
from .layers import apply_rope, rms_norm, rope_cos_sin, swiglu


@dataclasses.dataclass(frozen=True, kw_only=True)
class Eagle3Config:
    hidden_size: int  # H
    intermediate_size: int  # I
    num_heads: int  # Q
    num_kv_heads: int  # G
    head_dim: int  # D, explicit: Qwen3 drafters use 128 where H/heads is 80 (Qwen3-4B)
    vocab_size: int  # V, the target's: drafted tokens are embedded by their target id
    draft_vocab_size: int  # Vd <= V
    target_hidden_size: int  # Ht
    # Our convention: j = the residual stream entering target layer j (HF hidden_states[j]),
    # strictly ascending because every engine concatenates features in layer order.
    aux_layer_ids: tuple[int, ...]
    rope_theta: float = 10_000.0  # EAGLE/LlamaConfig/speculators default when a config sets none
    rms_norm_eps: float = 1e-6
    qk_norm: bool = False  # speculators drafters with a Qwen3 layer config: per-head, before RoPE
    norm_before_residual: bool = False  # residual = hidden_norm(x) instead of x
    norm_output: bool = False  # carry norm(r) instead of r to the next step
    fc_bias: bool = False  # SGLang's `bias: true`

    def __post_init__(self):
        check_attention_fields(self, ("hidden_size", "intermediate_size", "vocab_size",
                                      "draft_vocab_size", "target_hidden_size"))
        if self.draft_vocab_size > self.vocab_size:
            raise ConfigError(f"draft_vocab_size ({self.draft_vocab_size}) exceeds the target "
                              f"vocab_size ({self.vocab_size})")
        ids = tuple(self.aux_layer_ids)
        if not ids or any(not isinstance(j, int) or j < 0 for j in ids) or \
                any(a >= b for a, b in zip(ids, ids[1:])):
            raise ConfigError(f"aux_layer_ids must be non-empty, non-negative and strictly "
                              f"ascending, got {self.aux_layer_ids!r}")
        object.__setattr__(self, "aux_layer_ids", ids)

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    @property
    def feature_size(self) -> int:
        """fc's input width A*Ht."""
        return self.num_aux * self.target_hidden_size

    @classmethod
    def for_target(cls, target: Qwen3Config, **overrides) -> "Eagle3Config":
        """A drafter shaped like one layer of `target`, reading its default aux layers."""
        fields = dict(
            hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
            num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim, vocab_size=target.vocab_size,
            draft_vocab_size=target.vocab_size, target_hidden_size=target.hidden_size,
            aux_layer_ids=target.default_aux_layers, rope_theta=target.rope_theta,
            rms_norm_eps=target.rms_norm_eps)
        fields.update(overrides)
        return cls(**fields)


class Buffer(nnx.Variable):
    """Non-trainable state saved with the model (e.g. the d2t vocab map); not an nnx.Param,
    so optimisers and `nnx.state(model, nnx.Param)` leave it alone."""


class Eagle3Output(NamedTuple):
    logits: jax.Array  # [T, Vd] fp32
    state: jax.Array  # [T, H]: the hidden input of the next draft step (from_features=False)
    cache: KVCache  # [1, N, S, G, D]


def layer_param_shapes(cfg: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """The decoder layer's parameters: name -> shape. q/k/v read the [2H] concat."""
    h, i, q, g, d = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                     cfg.head_dim)
    shapes = {
        "input_layernorm": (h,),
        "hidden_norm": (h,),
        "q_proj": (2 * h, q, d),
        "k_proj": (2 * h, g, d),
        "v_proj": (2 * h, g, d),
        "o_proj": (q, d, h),
        "post_attention_layernorm": (h,),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    if cfg.qk_norm:
        shapes.update(q_norm=(d,), k_norm=(d,))
    return shapes


def _init(rngs: nnx.Rngs, name: str, shape: tuple[int, ...], dtype) -> nnx.Param:
    if name.endswith("norm"):
        return nnx.Param(jnp.ones(shape, dtype))
    return nnx.Param((0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype))


class Eagle3Layer(nnx.Module):
    def __init__(self, cfg: Eagle3Config, *, dtype, rngs: nnx.Rngs):
        shapes = layer_param_shapes(cfg)
        for name, shape in shapes.items():
            setattr(self, name, _init(rngs, name, shape, dtype))
        if not cfg.qk_norm:
            self.q_norm = self.k_norm = None


class Eagle3(nnx.Module):
    def __init__(self, cfg: Eagle3Config, *, dtype=jnp.float32, with_embed: bool = False,
                 rngs: nnx.Rngs):
        """with_embed: keep an own [V, H] embedding (checkpoints that ship `embed_tokens`);
        without it the caller passes the target's, which Eagle3 training keeps frozen anyway."""
        self.config = cfg
        h = cfg.hidden_size
        self.fc = _init(rngs, "fc", (cfg.feature_size, h), dtype)  # [A*Ht, H]
        self.fc_bias = nnx.Param(jnp.zeros((h,), dtype)) if cfg.fc_bias else None
        self.layer = Eagle3Layer(cfg, dtype=dtype, rngs=rngs)
        self.norm = nnx.Param(jnp.ones((h,), dtype))
        self.lm_head = _init(rngs, "lm_head", (h, cfg.draft_vocab_size), dtype)  # [H, Vd]
        self.d2t = Buffer(jnp.zeros((cfg.draft_vocab_size,), jnp.int32))  # [Vd] offsets
        self.embed = _init(rngs, "embed", (cfg.vocab_size, h), dtype) if with_embed else None

    @property
    def dtype(self):
        return self.fc.get_value().dtype

    def new_cache(self, *, num_slots: int, max_len: int, dtype=None) -> KVCache:
        cfg = self.config
        return KVCache.init(num_layers=1, num_slots=num_slots, max_len=max_len,
                            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                            dtype=dtype or self.dtype)

    def draft_to_target(self, draft_ids: jax.Array) -> jax.Array:
        """Draft-vocab ids [...] -> target-vocab ids (d2t holds offsets: id + d2t[id])."""
        return draft_ids + self.d2t[...][draft_ids]

    def project_features(self, features: jax.Array) -> jax.Array:
        """Target features [T, A*Ht] -> fc output [T, H]."""
        x = features.astype(self.dtype) @ self.fc[...]
        return x if self.fc_bias is None else x + self.fc_bias[...]

    def write_cache(self, tokens: jax.Array, hidden: jax.Array, positions: jax.Array,
                    slots: jax.Array, cache: KVCache, *, embed: jax.Array | None) -> KVCache:
        """The cache writes of a from-features forward (`__call__`) alone: each row's K/V at
        (slot, position), the same values, without attention, MLP or logits. One layer whose
        K/V depend only on the row's own inputs makes this exact and cheap (about a fifth of
        the forward): the engine's floor step keeps the drafter current with it."""
        cfg = self.config
        _, _, z = self._inputs(tokens, hidden, embed=embed, from_features=True)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, self.dtype)  # [T, D]
        k, v = self._keys_values(z, cos, sin)
        return KVCache(*write_kv(cache.k, cache.v, 0, slots, positions, k, v))

    def _inputs(self, tokens, hidden, *, embed, from_features):
        """(x [T, H] the row's state, h [T, H] its norm, z [T, 2H] the attention input)."""
        cfg = self.config
        want = cfg.feature_size if from_features else cfg.hidden_size
        if hidden.ndim != 2 or hidden.shape[-1] != want or hidden.shape[0] != tokens.shape[0]:
            kind = (f"target features [T, A*Ht] = [T, {cfg.num_aux}*{cfg.target_hidden_size}]"
                    if from_features else f"the carried state [T, H] = [T, {cfg.hidden_size}]")
            raise ValueError(f"hidden has shape {tuple(hidden.shape)} for {tokens.shape[0]} "
                             f"rows; from_features={from_features} expects {kind}")
        if embed is None:
            if self.embed is None:
                raise ValueError("this drafter has no embedding of its own: pass the target's "
                                 "embedding table [V, H] as `embed`")
            embed = self.embed[...]
        p = self.layer
        eps = cfg.rms_norm_eps
        dtype = self.dtype
        x = self.project_features(hidden) if from_features else hidden.astype(dtype)  # [T, H]
        e = rms_norm(embed[tokens].astype(dtype), p.input_layernorm[...], eps)  # [T, H]
        h = rms_norm(x, p.hidden_norm[...], eps)  # [T, H]
        return x, h, jnp.concatenate([e, h], axis=-1)  # z: embedding first

    def _keys_values(self, z, cos, sin):
        """K (normed, rotated) and V [T, G, D] of attention inputs z [T, 2H]."""
        cfg, p = self.config, self.layer
        k = jnp.einsum("tc,cgd->tgd", z, p.k_proj[...])  # [T, G, D]
        v = jnp.einsum("tc,cgd->tgd", z, p.v_proj[...])  # [T, G, D]
        if cfg.qk_norm:
            k = rms_norm(k, p.k_norm[...], cfg.rms_norm_eps)
        return apply_rope(k, cos, sin), v

    def __call__(self, tokens: jax.Array, hidden: jax.Array, positions: jax.Array,
                 slots: jax.Array, cache: KVCache, *, embed: jax.Array | None,
                 from_features: bool, logits_rows: jax.Array | None = None) -> Eagle3Output:
        """One draft step over flat rows.

        tokens, positions, slots: [T] int32; tokens are TARGET vocab ids (padding rows use
        slot = N: their K/V writes are dropped). hidden: [T, A*Ht] target features when
        from_features (step 0, goes through fc), else [T, H] the previous step's `state`.
        embed: the target's [V, H] embedding, or None to use this drafter's own.
        Each row writes its K/V at (slot, position) of the 1-layer cache and attends causally to
        its slot, so step-0 chunks and chained draft steps share one code path.
        logits_rows: optional [R] row indices; logits and state are then returned for those rows
        only (the engine needs them at each slot's accepted tail, not at every verify row).
        """
        cfg = self.config
        p = self.layer
        eps = cfg.rms_norm_eps
        x, h, z = self._inputs(tokens, hidden, embed=embed, from_features=from_features)
        q = jnp.einsum("tc,cqd->tqd", z, p.q_proj[...])  # [T, Q, D]
        if cfg.qk_norm:
            q = rms_norm(q, p.q_norm[...], eps)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, self.dtype)  # [T, D]
        q = apply_rope(q, cos, sin)
        k, v = self._keys_values(z, cos, sin)
        ck, cv = write_kv(cache.k, cache.v, 0, slots, positions, k, v)
        attn = verify_attention(q, ck, cv, slots, positions, layer=0)  # [T, Q, D]

        r = (h if cfg.norm_before_residual else x) + jnp.einsum("tqd,qdh->th", attn, p.o_proj[...])
        r = r + swiglu(rms_norm(r, p.post_attention_layernorm[...], eps), p.gate_proj[...],
                       p.up_proj[...], p.down_proj[...])  # [T, H]
        if logits_rows is not None:
            r = r[logits_rows]  # [R, H]
        normed = rms_norm(r, self.norm[...], eps)
        logits = jnp.einsum("th,hv->tv", normed, self.lm_head[...],
                            preferred_element_type=jnp.float32)  # [T, Vd]
        return Eagle3Output(logits, normed if cfg.norm_output else r, KVCache(ck, cv))
