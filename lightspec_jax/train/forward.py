"""Training forwards: the serving modules' math over a whole sequence, with dense causal attention.

The serving forwards (`Qwen3.__call__`, `Eagle3.__call__`) write a KV cache and read it back in a
loop whose trip count depends on the positions, which reverse-mode autodiff cannot go through.
Training needs no cache, so these functions apply the same parameters and the same building
blocks (models/layers.py) with a [T, T] causal mask instead; tests check them against the
serving forwards.

Axis legend (models/layers.py): B batch, T sequence, H hidden, Q/G query/KV heads, D head dim,
V vocab, Vd draft vocab, A aux layers, k the draft step of the training-time test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lightspec_jax.models import Eagle3, Qwen3
from lightspec_jax.models.layers import apply_rope, rms_norm, rope_cos_sin, swiglu

_MASK = -1e30


def _dense_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal GQA: q [T, Q, D], k/v [T, G, D] -> [T, Q, D], fp32 softmax."""
    t, num_q, d = q.shape
    g = k.shape[1]
    qg = q.reshape(t, g, num_q // g, d)  # [T, G, Q/G, D]
    scores = jnp.einsum("tgqd,sgd->gqts", qg, k, preferred_element_type=jnp.float32) * d ** -0.5
    causal = jnp.tril(jnp.ones((t, t), bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, _MASK), axis=-1)  # [G, Q/G, T, S]
    out = jnp.einsum("gqts,sgd->tgqd", probs.astype(v.dtype), v)
    return out.reshape(t, num_q, d)


def qwen3_hidden(model: Qwen3, tokens: jax.Array, aux_layers: tuple[int, ...] = ()
                 ) -> tuple[jax.Array, jax.Array | None]:
    """One sequence tokens [T] at positions 0..T-1 -> (last layer's output [T, H] before the
    final norm, aux features [T, A*H] = residual entering each aux layer, or None)."""
    cfg = model.config
    eps = cfg.rms_norm_eps
    x = model.embed_tokens(tokens)  # [T, H]
    cos, sin = rope_cos_sin(jnp.arange(tokens.shape[0]), cfg.head_dim, cfg.rope_theta, x.dtype)

    def layer(x, p):
        h = rms_norm(x, p["input_norm"], eps)
        q = apply_rope(rms_norm(jnp.einsum("th,hqd->tqd", h, p["q_proj"]), p["q_norm"], eps),
                       cos, sin)  # [T, Q, D]
        k = apply_rope(rms_norm(jnp.einsum("th,hgd->tgd", h, p["k_proj"]), p["k_norm"], eps),
                       cos, sin)  # [T, G, D]
        v = jnp.einsum("th,hgd->tgd", h, p["v_proj"])  # [T, G, D]
        x_in = x
        x = x + jnp.einsum("tqd,qdh->th", _dense_attention(q, k, v), p["o_proj"])
        x = x + swiglu(rms_norm(x, p["post_norm"], eps), p["gate_proj"], p["up_proj"],
                       p["down_proj"])
        return x, x_in

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
