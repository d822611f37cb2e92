"""The DFlash block drafter in Flax NNX: one forward drafts a whole block of tokens.

Architecture as in reference/checkpoint-formats.md §3 (z-lab/dflash `model/dflash.py`, SGLang
`models/dflash.py`), in our own words:

* context: the target's features at each committed position p (the OUTPUTS of target layers
  `target_layer_ids`, HF hidden_states[id + 1], concatenated in list order) [n*Ht] -> fc [H]
  -> hidden_norm = c_p. Every draft layer turns c_p into context K/V with its own k_proj (then
  k_norm, RoPE at p) and v_proj. Those depend on nothing but c_p, so they are computed once per
  committed position and kept in a per-slot cache (`write_context`), like a KV cache.
* block: [bonus token at position seq_len, then mask tokens] embedded with the target's
  embedding, through Qwen3 layers (q_norm/k_norm, GQA, SwiGLU) whose queries are the block rows
  and whose keys/values are the cached context (positions < seq_len) plus the block's own
  (input_layernorm(x) through the same k_proj/v_proj): attention is NOT causal inside the
  block, every block row sees the whole block and the whole context.
* the stack ends with `norm`; the caller maps rows 1.. through the TARGET's lm_head (its
  embedding when tied): row i predicts the token at position seq_len + i.

Axis legend (as in layers.py): N slots, P block rows, T flat rows, H hidden, Ht target hidden,
n feature layers, I intermediate, L draft layers, Q/G query/KV heads, D head dim, V vocab,
S cache length.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from .config import ConfigError, Qwen3Config, check_attention_fields
from .kv_cache import KVCache
from .layers import apply_rope, layer_unroll, rms_norm, rope_cos_sin
from .qwen3 import Qwen3Layers, _decoder_layer


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The feature layers a checkpoint that names none was trained on (z-lab/dflash
    `model/utils.py` build_target_layer_ids): the middle layer for one draft layer, else
    evenly spread over 1 .. L-3 with Python's round()."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1))
                 for i in range(num_draft_layers))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DFlashConfig:
    hidden_size: int  # H: the target's (blocks are embedded and read out by the target)
    intermediate_size: int  # I
    num_layers: int  # L draft layers
    num_heads: int  # Q
    num_kv_heads: int  # G
    head_dim: int  # D, explicit as in Qwen3
    vocab_size: int  # V, the target's
    target_hidden_size: int  # Ht
    # Target layer ids whose OUTPUT is a feature (HF hidden_states[id + 1]), in fc's order.
    target_layer_ids: tuple[int, ...]
    block_size: int  # P: rows of one draft forward, the bonus token included
    mask_token_id: int  # fills the block after the bonus token
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6

    # Class constants, not fields: the drafter's name in messages and the lowest feature id
    # (DSpark's -1 names the embedding output).
    NAME = "DFlash"
    MIN_LAYER_ID = 0

    def __post_init__(self):
        check_attention_fields(self, ("hidden_size", "intermediate_size", "num_layers",
                                      "vocab_size", "target_hidden_size"))
        ids = tuple(self.target_layer_ids)
        low = self.MIN_LAYER_ID
        if (not ids or any(not isinstance(j, int) or j < low for j in ids)
                or len(set(ids)) < len(ids)):
            raise ConfigError(f"target_layer_ids must be non-empty, distinct and >= {low}, "
                              f"got {self.target_layer_ids!r}")
        object.__setattr__(self, "target_layer_ids", ids)
        if not isinstance(self.block_size, int) or self.block_size < 2:
            raise ConfigError(f"block_size must be an int >= 2 (the bonus token and at least "
                              f"one mask), got {self.block_size!r}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id={self.mask_token_id} is outside the vocabulary "
                              f"[0, {self.vocab_size})")

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """The features in Qwen3's `aux_layers` convention (the residual entering layer j):
        output of layer id = entering id + 1; for id = L-1 that is j = L, which Qwen3 (like HF
        hidden_states[L], the list these checkpoints were trained on) gives after the final
        norm."""
        return tuple(j + 1 for j in self.target_layer_ids)

    @property
    def feature_size(self) -> int:
        """fc's input width n*Ht."""
        return len(self.target_layer_ids) * self.target_hidden_size

    @property
    def layer_config(self) -> Qwen3Config:
        """The draft layers' shapes as a Qwen3 config (they are Qwen3 decoder layers)."""
        return Qwen3Config(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=self.num_layers,
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                           head_dim=self.head_dim, rope_theta=self.rope_theta,
                           rms_norm_eps=self.rms_norm_eps)

    def check_target(self, target: Qwen3Config) -> None:
        """ConfigError unless this drafter can serve `target`: its embedding and lm_head read
        the block, so H must match; fc reads its features, so Ht and the layer ids must fit."""
        for name, ours, want in (("hidden_size", self.hidden_size, target.hidden_size),
                                 ("target_hidden_size", self.target_hidden_size,
                                  target.hidden_size),
                                 ("vocab_size", self.vocab_size, target.vocab_size)):
            if ours != want:
                raise ConfigError(f"{name}={ours} does not match the target's {want}: this "
                                  f"{self.NAME} drafter was trained for a different target")
        bad = [j for j in self.target_layer_ids if j >= target.num_layers]
        if bad:
            raise ConfigError(f"target_layer_ids {list(self.target_layer_ids)} name layer "
                              f"{bad[0]}, outside [0, {target.num_layers}) for the "
                              f"{target.num_layers}-layer target")

    @classmethod
    def for_target(cls, target: Qwen3Config, *, num_layers: int = 2, block_size: int = 8,
                   mask_token_id: int | None = None, **overrides) -> "DFlashConfig":
        """A drafter shaped like `target`'s layers, on the default feature layers; the mask
        token defaults to the last vocabulary id."""
        fields = dict(
            hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
            num_layers=num_layers, num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim, vocab_size=target.vocab_size,
            target_hidden_size=target.hidden_size,
            target_layer_ids=default_target_layer_ids(target.num_layers, num_layers),
            block_size=block_size,
            mask_token_id=target.vocab_size - 1 if mask_token_id is None else mask_token_id,
            rope_theta=target.rope_theta, rms_norm_eps=target.rms_norm_eps)
        fields.update(overrides)
        return cls(**fields)


class DFlashOutput(NamedTuple):
    hidden: jax.Array  # [N, P, H] after the final norm (the caller applies the target's head)
    cache: KVCache  # [L, N, S, G, D]; the block's K/V now sit past each slot's context


class DFlash(nnx.Module):
    def __init__(self, cfg: DFlashConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = cfg
        h = cfg.hidden_size
        self.fc = nnx.Param((0.02 * jax.random.normal(rngs.params(), (cfg.feature_size, h),
                                                      jnp.float32)).astype(dtype))  # [n*Ht, H]
        self.hidden_norm = nnx.Param(jnp.ones((h,), dtype))
        self.layers = Qwen3Layers(cfg.layer_config, dtype=dtype, rngs=rngs)  # stacked on [L]
        self.norm = nnx.Param(jnp.ones((h,), dtype))

    @property
    def dtype(self):
        return self.fc.get_value().dtype

    def new_cache(self, *, num_slots: int, max_len: int, dtype=None) -> KVCache:
        cfg = self.config
        return KVCache.init(num_layers=cfg.num_layers, num_slots=num_slots, max_len=max_len,
                            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                            dtype=dtype or self.dtype)

    def context(self, features: jax.Array) -> jax.Array:
        """Target features [T, n*Ht] -> context c [T, H] (fc, then hidden_norm)."""
        cfg = self.config
        if features.ndim != 2 or features.shape[-1] != cfg.feature_size:
            raise ValueError(f"features have shape {tuple(features.shape)}; expected [T, n*Ht] "
                             f"= [T, {len(cfg.target_layer_ids)}*{cfg.target_hidden_size}]")
        x = features.astype(self.dtype) @ self.fc[...]  # [T, H]
        return rms_norm(x, self.hidden_norm[...], cfg.rms_norm_eps)

    def context_kv(self, features: jax.Array, positions: jax.Array):
        """Every draft layer's context K (normed, rotated) and V [L, T, G, D] for features
        [T, n*Ht] at positions [T]."""
        cfg = self.config
        c = self.context(features)  # [T, H]
        p = self.layers.stacked()
        k = jnp.einsum("th,lhgd->ltgd", c, p["k_proj"])  # [L, T, G, D]
        v = jnp.einsum("th,lhgd->ltgd", c, p["v_proj"])  # [L, T, G, D]
        k = rms_norm(k, p["k_norm"][:, None, None, :], cfg.rms_norm_eps)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, self.dtype)  # [T, D]
        return apply_rope(k, cos, sin), v

    def write_context(self, features: jax.Array, positions: jax.Array, slots: jax.Array,
                      cache: KVCache) -> KVCache:
        """Writes the context K/V of rows (features [T, n*Ht], positions, slots [T]; padding
        rows use slot = N and are dropped) into every layer of the cache."""
        k, v = self.context_kv(features, positions)
        return KVCache(cache.k.at[:, slots, positions].set(k.astype(cache.k.dtype), mode="drop"),
                       cache.v.at[:, slots, positions].set(v.astype(cache.v.dtype), mode="drop"))

    def __call__(self, tokens: jax.Array, start: jax.Array, slots: jax.Array, cache: KVCache,
                 *, embed: jax.Array) -> DFlashOutput:
        """One block forward per slot.

        tokens: [N, P] int32 target ids (the bonus token, then masks); start: [N] int32 the
        block's first position (= the committed length: the cache holds context K/V for
        positions < start); slots: [N] int32 (N: not drafting, writes dropped); embed: the
        target's [V, H] embedding. The block's K/V are written at start .. start+P-1 (past the
        context: the next commit overwrites them), so the cache needs P positions of room.
        """
        cfg = self.config
        n, p = tokens.shape
        x = embed[tokens.reshape(-1)].astype(self.dtype)  # [T, H], T = N*P, slot-major
        positions = (start[:, None] + jnp.arange(p, dtype=jnp.int32)).reshape(-1)  # [T]
        row_slot = jnp.repeat(slots, p)  # [T]
        # Non-causal block: every row sees up to the block's last position.
        visible = jnp.repeat(start + p - 1, p)  # [T]
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, self.dtype)  # [T, D]
        layer_cfg = cfg.layer_config

        def layer_step(carry, xs):
            x, ck, cv = carry
            params, layer = xs
            x, ck, cv = _decoder_layer(layer_cfg, params, layer, x, ck, cv, row_slot, positions,
                                       cos, sin, visible=visible)
            return (x, ck, cv), None

        xs = (self.layers.stacked(), jnp.arange(cfg.num_layers))
        (x, ck, cv), _ = jax.lax.scan(layer_step, (x, cache.k, cache.v), xs,
                                      unroll=layer_unroll(cfg.num_layers))
        x = rms_norm(x, self.norm[...], cfg.rms_norm_eps)
        return DFlashOutput(x.reshape(n, p, -1), KVCache(ck, cv))
