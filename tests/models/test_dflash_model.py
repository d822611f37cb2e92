"""DFlash drafter vs an independent float64 NumPy reference written from the architecture rules
(reference/checkpoint-formats.md §3), fed with transformers' own hidden states of the tiny target.

The reference reads the z-lab files themselves (HF key names, torch [out, in] layouts) and takes
features as HF hidden_states[id + 1] (the outputs of layers `target_layer_ids`; for id = L-1 that
is hidden_states[L], after the final norm), so the loader, the layer-id convention, the cached
context (written by prefill and by a commit with stale rows past the committed length) and the
non-causal block forward are all under test.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file

from dflash_fixtures import write_zlab_dflash
from lightspec_jax.checkpoint import load_dflash, load_qwen3
from lightspec_jax.drafters import DFlashDrafter, DraftRows
from lightspec_jax.models import PRESETS, DFlash, DFlashConfig, KVCache

IDS = (1, 4, 7)  # 7 = L-1 for the 8-layer tiny targets: its output is hidden_states[8]
BLOCK = 5


def _rms(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):  # x [R, heads, D] at positions [R]; NeoX rotate_half
    d = x.shape[-1]
    ang = np.asarray(pos, np.float64)[:, None] * theta ** (-np.arange(0, d, 2) / d)
    ang = np.concatenate([ang, ang], axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * np.cos(ang) + rot * np.sin(ang)


class ReferenceDFlash:
    """One block forward for one request: context features of positions 0..C-1, block at C."""

    def __init__(self, directory, embed, lm_head):
        with open(os.path.join(directory, "config.json")) as f:
            self.hf = json.load(f)
        self.w = {k: v.astype(np.float64) for k, v in
                  load_file(os.path.join(directory, "model.safetensors")).items()}
        self.embed, self.lm_head = embed, lm_head  # the target's [V, H] each
        ids_and_mask = self.hf.get("dflash_config", self.hf)  # DSpark's are top-level
        self.ids = ids_and_mask["target_layer_ids"]
        self.mask = ids_and_mask["mask_token_id"]

    def features(self, hidden_states, upto):
        """concat of HF hidden_states[id + 1] over the listed ids, positions < upto."""
        return np.concatenate([hidden_states[i + 1][:upto] for i in self.ids], axis=-1)

    def block(self, features, bonus, size=None):
        """The block [bonus, mask x (size - 1)] (size: the trained block_size by default)."""
        hf, w = self.hf, self.w
        qh, gh, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
        theta, size = hf["rope_theta"], size or hf["block_size"]
        ctx_len = features.shape[0]
        ctx = _rms(features @ w["fc.weight"].T, w["hidden_norm.weight"])  # [C, H]
        tokens = [bonus] + [self.mask] * (size - 1)
        x = self.embed[tokens]  # [P, H]
        block_pos = np.arange(ctx_len, ctx_len + size)
        key_pos = np.arange(ctx_len + size)
        for i in range(hf["num_hidden_layers"]):
            def p(name, i=i):
                return w[f"layers.{i}.{name}.weight"]
            h = _rms(x, p("input_layernorm"))
            q = _rope(_rms((h @ p("self_attn.q_proj").T).reshape(size, qh, d),
                           p("self_attn.q_norm")), block_pos, theta)
            kv_in = np.concatenate([ctx, h])  # [C+P, H]: context unnormed, block normed
            k = _rope(_rms((kv_in @ p("self_attn.k_proj").T).reshape(-1, gh, d),
                           p("self_attn.k_norm")), key_pos, theta)
            v = (kv_in @ p("self_attn.v_proj").T).reshape(-1, gh, d)
            out = np.empty((size, qh, d))
            for j in range(qh):  # no mask: every block row sees context and block
                s = q[:, j] @ k[:, j // (qh // gh)].T / np.sqrt(d)  # [P, C+P]
                prob = np.exp(s - s.max(-1, keepdims=True))
                out[:, j] = (prob / prob.sum(-1, keepdims=True)) @ v[:, j // (qh // gh)]
            x = x + out.reshape(size, -1) @ p("self_attn.o_proj").T
            m = _rms(x, p("post_attention_layernorm"))
            gate, up = m @ p("mlp.gate_proj").T, m @ p("mlp.up_proj").T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ p("mlp.down_proj").T
        hidden = _rms(x, w["norm.weight"])
        return hidden, hidden[1:] @ self.lm_head.T  # [P, H], [P-1, V]


@pytest.fixture(scope="module", params=["untied_sharded", "tied_single"])
def setup(request, hf_checkpoints, tmp_path_factory):
    target_dir, hf_model = hf_checkpoints[request.param]
    target = load_qwen3(target_dir)
    cfg = target.config
    directory = str(tmp_path_factory.mktemp("dflash"))
    write_zlab_dflash(directory, target_layers=cfg.num_layers, vocab_size=cfg.vocab_size,
                      target_layer_ids=IDS, block_size=BLOCK, mask_token_id=17, seed=3)
    drafter = DFlashDrafter(load_dflash(directory, target_config=cfg), target)
    embed = hf_model.model.embed_tokens.weight.detach().double().numpy()
    head = hf_model.lm_head.weight.detach().double().numpy()
    return target, hf_model, drafter, ReferenceDFlash(directory, embed, head)


def _hf_states(hf_model, seq):
    with torch.no_grad():
        out = hf_model(torch.tensor([seq]), output_hidden_states=True)
    return [h[0].double().numpy() for h in out.hidden_states]


def _features(target, drafter, seq):
    """Our target's aux features [T, n*H] of one request's tokens."""
    n = len(seq)
    out = target(jnp.asarray(seq, jnp.int32), jnp.arange(n, dtype=jnp.int32),
                 jnp.zeros(n, jnp.int32), target.new_cache(num_slots=1, max_len=32),
                 aux_layers=drafter.aux_layers)
    return out.aux_hidden


def test_block_forward_matches_the_reference(setup):
    target, hf_model, drafter, ref = setup
    rng = np.random.default_rng(0)
    v = target.config.vocab_size
    seqs = [rng.integers(2, v, 10).tolist(), rng.integers(2, v, 7).tolist()]
    ctx_len = [9, 6]  # committed positions; the last token of each is the bonus
    states = [_hf_states(hf_model, s) for s in seqs]
    feats = [_features(target, drafter, s) for s in seqs]
    for f, st, c in zip(feats, states, ctx_len):  # our aux layers = HF hidden_states[id + 1]
        np.testing.assert_allclose(np.asarray(f)[:c], ref.features(st, c), atol=2e-5, rtol=1e-5)

    cache = drafter.new_cache(num_slots=2, cache_len=32)
    cache = cache._replace(k=jnp.full_like(cache.k, jnp.nan), v=jnp.full_like(cache.v, jnp.nan))
    # Slot 0: a 9-token prompt. Slot 1: a 3-token prompt, then a commit of 3 accepted rows,
    # 8 rejected ones whose (garbage) context lands past the block (never read), and a padding
    # row (slot N = 2, dropped).
    prefill = DraftRows(token=None, next_token=None,
                        hidden=jnp.concatenate([feats[0][:9], feats[1][:3]]),
                        position=jnp.asarray(list(range(9)) + [0, 1, 2], jnp.int32),
                        slot=jnp.asarray([0] * 9 + [1] * 3, jnp.int32))
    cache = drafter.prefill(drafter.param_leaves, cache, prefill, target_embed=None)
    stale = jnp.asarray(rng.standard_normal((9, feats[1].shape[1])), jnp.float32)
    commit = DraftRows(token=None, next_token=None,
                       hidden=jnp.concatenate([feats[1][3:6], stale]),
                       position=jnp.asarray(list(range(3, 14)) + [0], jnp.int32),
                       slot=jnp.asarray([1] * 11 + [2], jnp.int32))
    cache = drafter.commit(drafter.param_leaves, cache, commit, tail_row=jnp.asarray([0, 2]),
                           target_embed=None)

    embed = target.embed[...]
    bonus = jnp.asarray([seqs[0][9], seqs[1][6]], jnp.int32)
    start = jnp.asarray(ctx_len, jnp.int32)
    tokens = jnp.full((2, BLOCK), 17, jnp.int32).at[:, 0].set(bonus)
    out = drafter.module(drafter.param_leaves).model(tokens, start, jnp.arange(2), cache,
                                                     embed=embed)
    _, proposal = drafter.draft(drafter.param_leaves, cache, last_token=bonus, seq_len=start,
                                drafting=jnp.asarray([True, True]), depth=BLOCK - 2,
                                max_depth=BLOCK, target_embed=embed)
    for i, (st, c) in enumerate(zip(states, ctx_len)):
        want_hidden, _ = ref.block(ref.features(st, c), int(bonus[i]))
        np.testing.assert_allclose(np.asarray(out.hidden[i]), want_hidden, atol=2e-5, rtol=1e-5)
        # The drafter cuts its block to the depth: [bonus, mask x d].
        _, want_logits = ref.block(ref.features(st, c), int(bonus[i]), size=BLOCK - 1)
        probs = np.exp(want_logits - want_logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        want_tokens = want_logits.argmax(-1)[:BLOCK - 2]  # rows 1..d
        assert np.asarray(proposal.tokens[i]).tolist() == want_tokens.tolist() + [0, 0]
        np.testing.assert_allclose(np.asarray(proposal.confidence[i, :BLOCK - 2]),
                                   probs[np.arange(BLOCK - 2), want_tokens], atol=1e-5)
        assert not np.asarray(proposal.confidence[i, BLOCK - 2:]).any()


def test_depth_is_bounded_by_the_block(setup):
    target, _, drafter, _ = setup
    cache = drafter.new_cache(num_slots=1, cache_len=16)
    with pytest.raises(ValueError, match=r"depth must be in \[1, 4\].*block size 5"):
        drafter.draft(drafter.param_leaves, cache, last_token=jnp.zeros(1, jnp.int32),
                      seq_len=jnp.ones(1, jnp.int32), drafting=jnp.ones(1, bool), depth=5,
                      max_depth=6, target_embed=target.embed[...])


def test_real_size_shapes():
    """Qwen3-8B-DFlash-b16's shapes (reference/checkpoint-formats.md §3), with eval_shape only."""
    cfg = DFlashConfig.for_target(PRESETS["qwen3-8b"], num_layers=5, block_size=16,
                                  mask_token_id=151669)
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33) and cfg.aux_layers == (2, 10, 18, 26, 34)
    model = nnx.eval_shape(lambda: DFlash(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    assert model.fc.shape == (5 * 4096, 4096) and model.layers.q_proj.shape == (5, 4096, 32, 128)
    graphdef, state = nnx.split(model)
    n, s = 4, 256
    cache = KVCache.abstract(num_layers=5, num_slots=n, max_len=s, num_kv_heads=8, head_dim=128,
                             dtype=jnp.bfloat16)
    embed = jax.ShapeDtypeStruct((151936, 4096), jnp.bfloat16)
    ints = jax.ShapeDtypeStruct((n,), jnp.int32)
    out = jax.eval_shape(
        lambda st, c, e, start: nnx.merge(graphdef, st)(
            jnp.zeros((n, 16), jnp.int32), start, jnp.arange(n), c, embed=e),
        state, cache, embed, ints)
    assert out.hidden.shape == (n, 16, 4096) and out.cache.k.shape == (5, n, s, 8, 128)
