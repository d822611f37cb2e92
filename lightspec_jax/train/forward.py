"""Training forwards: the serving modules' math over a whole sequence, with dense causal attention.

The serving forwards (`Qwen3.__call__`, `Eagle3.__call__`) write a KV cache and read it back in a
loop whose trip count depends on the positions, which reverse-mode autodiff cannot go through.
Training needs no cache, so these functions apply the same parameters and the same building
blocks (models/layers.py) with a [T, T] causal mask instead; tests check them against the
serving forwards.

Axis legend (models/layers.py): B batch, T sequence, H hidden, Q/G query/KV heads, D head dim,
V vocab, Vd draft vocab, A aux layers, k the draft step of the training-time test, M DFlash blocks
per sequence, P block rows, F DFlash feature width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lightspec_jax.models import DFlash, Eagle3, Qwen3
from lightspec_jax.models.layers import apply_rope, rms_norm, rope_cos_sin, swiglu

_MASK = -1e30


def _dense_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                     mask: jax.Array | None = None) -> jax.Array:
    """GQA: q [T, Q, D], k/v [S, G, D] -> [T, Q, D], fp32 softmax; mask [T, S] bool (True:
    attend), default causal (T = S)."""
    t, num_q, d = q.shape
    g = k.shape[1]
    qg = q.reshape(t, g, num_q // g, d)  # [T, G, Q/G, D]
    scores = jnp.einsum("tgqd,sgd->gqts", qg, k, preferred_element_type=jnp.float32) * d ** -0.5
    if mask is None:
        mask = jnp.tril(jnp.ones((t, t), bool))
    probs = jax.nn.softmax(jnp.where(mask, scores, _MASK), axis=-1)  # [G, Q/G, T, S]
    out = jnp.einsum("gqts,sgd->tgqd", probs.astype(v.dtype), v)
    return out.reshape(t, num_q, d)


def _qwen3_layer(p: dict[str, jax.Array], x: jax.Array, cos: jax.Array, sin: jax.Array,
                 eps: float, *, prefix_kv: tuple[jax.Array, jax.Array] | None = None,
                 mask: jax.Array | None = None) -> jax.Array:
    """One Qwen3 decoder layer (models/qwen3.py `_decoder_layer`'s math) on rows x [T, H] at
    RoPE (cos, sin) [T, D]. prefix_kv: keys/values [S0, G, D] placed before the rows' own
    (DFlash's context); mask [T, S0 + T] (default: causal over the rows alone)."""
    h = rms_norm(x, p["input_norm"], eps)
    q = apply_rope(rms_norm(jnp.einsum("th,hqd->tqd", h, p["q_proj"]), p["q_norm"], eps),
                   cos, sin)  # [T, Q, D]
    k = apply_rope(rms_norm(jnp.einsum("th,hgd->tgd", h, p["k_proj"]), p["k_norm"], eps),
                   cos, sin)  # [T, G, D]
    v = jnp.einsum("th,hgd->tgd", h, p["v_proj"])  # [T, G, D]
    if prefix_kv is not None:
        k, v = (jnp.concatenate([a, b]) for a, b in zip(prefix_kv, (k, v)))  # [S0 + T, G, D]
    x = x + jnp.einsum("tqd,qdh->th", _dense_attention(q, k, v, mask), p["o_proj"])
    return x + swiglu(rms_norm(x, p["post_norm"], eps), p["gate_proj"], p["up_proj"],
                      p["down_proj"])


def qwen3_hidden(model: Qwen3, tokens: jax.Array, aux_layers: tuple[int, ...] = ()
                 ) -> tuple[jax.Array, jax.Array | None]:
    """One sequence tokens [T] at positions 0..T-1 -> (last layer's output [T, H] before the
    final norm, aux features [T, A*H] = residual entering each aux layer, or None)."""
    cfg = model.config
    eps = cfg.rms_norm_eps
    x = model.embed_tokens(tokens)  # [T, H]
    cos, sin = rope_cos_sin(jnp.arange(tokens.shape[0]), cfg.head_dim, cfg.rope_theta, x.dtype)

    def layer(x, p):
        return _qwen3_layer(p, x, cos, sin, eps), x  # (output, residual entering the layer)

    # Rematerialised per layer: activation memory stays near one layer's worth.
    x, inputs = jax.lax.scan(layer, x, model.layers.stacked())  # inputs [L, T, H]
    if not aux_layers:
        return x, None
    return x, jnp.concatenate([inputs[j] for j in aux_layers], axis=-1)  # [T, A*H]


def qwen3_logits(model: Qwen3, tokens: jax.Array) -> jax.Array:
    """tokens [B, T] -> fp32 logits [B, T, V] (each row a sequence at positions 0..T-1)."""
    return jax.vmap(lambda t: model.logits(qwen3_hidden(model, t)[0]))(tokens)


def eagle3_unrolled(drafter: Eagle3, embed: jax.Array, features: jax.Array, tokens: jax.Array,
                    num_steps: int) -> list[jax.Array]:
    """EAGLE-3's training-time test over one sequence: logits of draft steps 0..num_steps-1.

    features [T, A*Ht] are the target's at positions 0..T-1, tokens [T] the sequence. Step 0 row
    t reads (fc(features_t), token t+1) at position t and predicts token t+2, exactly as the
    serving commit forward does. Step k >= 1 row t reads (the state step k-1 produced at row t,
    token t+1+k) at position t+k, and attends to the step-0 keys at positions <= t plus its own
    keys of steps 1..k (the per-row "diagonal"): what a chain rooted at t sees in the cache at
    serving time. Recipe from SafeAILab/EAGLE `eagle/traineagle3/cnets.py` (`Model.forward`,
    `LlamaAttention.forward`); rows whose inputs run past the sequence end read token 0 and
    their logits must be masked by the caller. Returns num_steps logits [T, Vd] fp32.
    """
    cfg = drafter.config
    p = drafter.layer
    eps = cfg.rms_norm_eps
    dtype = drafter.dtype
    t_len = tokens.shape[0]
    num_q, num_kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    group = num_q // num_kv
    positions = jnp.arange(t_len)
    causal = positions[None, :] <= positions[:, None]  # [T, S]

    def project(token_ids, x, shift):
        e = rms_norm(embed[token_ids].astype(dtype), p.input_layernorm[...], eps)
        h = rms_norm(x, p.hidden_norm[...], eps)
        z = jnp.concatenate([e, h], axis=-1)  # [T, 2H], embedding first
        q = jnp.einsum("tc,cqd->tqd", z, p.q_proj[...])  # [T, Q, D]
        k = jnp.einsum("tc,cgd->tgd", z, p.k_proj[...])  # [T, G, D]
        v = jnp.einsum("tc,cgd->tgd", z, p.v_proj[...])  # [T, G, D]
        if cfg.qk_norm:
            q, k = rms_norm(q, p.q_norm[...], eps), rms_norm(k, p.k_norm[...], eps)
        cos, sin = rope_cos_sin(positions + shift, d, cfg.rope_theta, dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, h

    def finish(x, h, attn):
        r = (h if cfg.norm_before_residual else x) + jnp.einsum("tqd,qdh->th", attn, p.o_proj[...])
        r = r + swiglu(rms_norm(r, p.post_attention_layernorm[...], eps), p.gate_proj[...],
                       p.up_proj[...], p.down_proj[...])  # [T, H]
        normed = rms_norm(r, drafter.norm[...], eps)
        logits = jnp.einsum("th,hv->tv", normed, drafter.lm_head[...],
                            preferred_element_type=jnp.float32)  # [T, Vd]
        return logits, (normed if cfg.norm_output else r)

    def shifted(k):  # token t+1+k at row t; zero past the end
        return jnp.concatenate([tokens[1 + k:], jnp.zeros((1 + k,), tokens.dtype)])[:t_len]

    x = drafter.project_features(features)  # [T, H]
    q0, k0, v0, h = project(shifted(0), x, 0)
    logits, state = finish(x, h, _dense_attention(q0, k0, v0))
    outputs = [logits]
    chain_k, chain_v = [], []  # step j's keys/values per row: [T, G, D] each
    for k in range(1, num_steps):
        x = state
        q, kk, vv, h = project(shifted(k), x, k)
        chain_k.append(kk)
        chain_v.append(vv)
        qg = q.reshape(t_len, num_kv, group, d)  # [T, G, Q/G, D]
        base = jnp.einsum("tgqd,sgd->tgqs", qg, k0, preferred_element_type=jnp.float32)
        base = jnp.where(causal[:, None, None, :], base, _MASK)  # [T, G, Q/G, S]
        diag = jnp.stack([jnp.einsum("tgqd,tgd->tgq", qg, c, preferred_element_type=jnp.float32)
                          for c in chain_k], axis=-1)  # [T, G, Q/G, k]
        probs = jax.nn.softmax(jnp.concatenate([base, diag], axis=-1) * d ** -0.5, axis=-1)
        attn = jnp.einsum("tgqs,sgd->tgqd", probs[..., :t_len].astype(dtype), v0)
        attn = attn + jnp.einsum("tgqj,jtgd->tgqd", probs[..., t_len:].astype(dtype),
                                 jnp.stack(chain_v))
        logits, state = finish(x, h, attn.reshape(t_len, num_q, d))
        outputs.append(logits)
    return outputs


def dflash_blocks(drafter: DFlash, embed: jax.Array, features: jax.Array, tokens: jax.Array,
                  anchors: jax.Array) -> jax.Array:
    """DFlash blocks drafted at several anchors of one sequence, in one pass: hidden [M, P, H]
    after the drafter's final norm (the caller applies the target's head).

    features [T, F] are the target's at positions 0..T-1 (`DFlashConfig.aux_layers`), tokens
    [T] the sequence, anchors [M] int32 committed lengths, 1 <= a <= T - 1. The block at anchor
    a is what the serving drafter (`DFlash.__call__`) runs once a tokens are committed: rows
    [token a, mask x (P-1)] at positions a..a+P-1, attending to the context of positions < a
    and to their whole block (not causally), through the same context K/V (`context_kv`).
    Row i >= 1 predicts the token at a + i. Blocks do not see each other.
    """
    cfg = drafter.config
    p_len, t_len, m = cfg.block_size, tokens.shape[0], anchors.shape[0]
    ctx_k, ctx_v = drafter.context_kv(features, jnp.arange(t_len))  # [L, T, G, D] each
    block = jnp.full((m, p_len), cfg.mask_token_id, jnp.int32).at[:, 0].set(tokens[anchors])
    x = embed[block.reshape(-1)].astype(drafter.dtype)  # [M*P, H]
    positions = (anchors[:, None] + jnp.arange(p_len)).reshape(-1)  # [M*P]
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, drafter.dtype)
    row_anchor = jnp.repeat(anchors, p_len)  # [M*P]
    row_block = jnp.repeat(jnp.arange(m), p_len)  # [M*P]
    mask = jnp.concatenate([jnp.arange(t_len)[None, :] < row_anchor[:, None],  # context
                            row_block[None, :] == row_block[:, None]], axis=1)  # [M*P, T + M*P]

    def layer(x, xs):
        params, k, v = xs
        return _qwen3_layer(params, x, cos, sin, cfg.rms_norm_eps, prefix_kv=(k, v),
                            mask=mask), None

    x, _ = jax.lax.scan(layer, x, (drafter.layers.stacked(), ctx_k, ctx_v))
    return rms_norm(x, drafter.norm[...], cfg.rms_norm_eps).reshape(m, p_len, -1)
