"""Eagle3 drafter vs an independent float64 NumPy reference written from the architecture rules
(reference/checkpoint-formats.md §2.1), fed with the real tiny target's hidden states.

The reference reads the HF files themselves (config.json + safetensors, HF key names and torch
[out, in] layouts) and takes target features from transformers' `hidden_states`, so the
loader's name map, transforms and layer-id conventions are all under test, not only the math.
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file

from lightspec_jax.checkpoint import load_eagle3, load_qwen3, save_eagle3_hf
from lightspec_jax.models import Eagle3, Eagle3Config

VD = 96  # draft vocab < the tiny target's 256
NUM_SLOTS = 3
STEP0_ROWS = 12  # every step-0 call is padded to this many rows: one compile


@functools.partial(nnx.jit, static_argnames="from_features")
def _step(model, tokens, hidden, positions, slots, cache, embed, *, from_features):
    return model(tokens, hidden, positions, slots, cache, embed=embed, from_features=from_features)


# --- reference ------------------------------------------------------------------------------

def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):  # x [heads, D] at one position; NeoX rotate_half
    d = x.shape[-1]
    ang = pos * theta ** (-np.arange(0, d, 2) / d)
    ang = np.concatenate([ang, ang])
    rot = np.concatenate([-x[:, d // 2:], x[:, :d // 2]], axis=-1)
    return x * np.cos(ang) + rot * np.sin(ang)


class ReferenceDrafter:
    """One Eagle3 step at a time, per slot, from the HF checkpoint files."""

    def __init__(self, directory, target_embed):
        with open(os.path.join(directory, "config.json")) as f:
            hf = json.load(f)
        self.w = {k: v.astype(np.float64) if v.dtype.kind == "f" else v
                  for k, v in load_file(os.path.join(directory, "model.safetensors")).items()}
        speculators = "transformer_layer_config" in hf
        layer = hf["transformer_layer_config"] if speculators else hf
        self.prefix = "layers.0." if speculators else "midlayer."
        if speculators:  # HF hidden_states indices
            self.aux = list(hf["eagle_aux_hidden_state_layer_ids"])
        else:  # SGLang: output of layer i = hidden_states[i + 1]
            self.aux = [i + 1 for i in hf["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        self.heads, self.kv_heads = layer["num_attention_heads"], layer["num_key_value_heads"]
        self.head_dim, self.eps = layer["head_dim"], layer["rms_norm_eps"]
        self.theta = layer.get("rope_theta", 10000.0)
        self.nbr = hf.get("norm_before_residual", False)
        self.norm_output = hf.get("norm_output", False)
        self.embed = self.w.get("embed_tokens.weight", target_embed)
        self.kv = {}  # slot -> {position: (k [G, D], v [G, D])}

    def p(self, name):
        return self.w[self.prefix + name]

    def to_target(self, draft_id):
        return int(draft_id + self.w["d2t"][draft_id]) if "d2t" in self.w else int(draft_id)

    def step(self, slot, token, hidden, pos, from_features):
        w, eps, d = self.w, self.eps, self.head_dim
        x = hidden
        if from_features:
            x = w["fc.weight"] @ hidden + w.get("fc.bias", 0.0)
        e = _rms(self.embed[token], self.p("input_layernorm.weight"), eps)
        h = _rms(x, self.p("hidden_norm.weight"), eps)
        z = np.concatenate([e, h])
        q = (self.p("self_attn.q_proj.weight") @ z).reshape(self.heads, d)
        k = (self.p("self_attn.k_proj.weight") @ z).reshape(self.kv_heads, d)
        v = (self.p("self_attn.v_proj.weight") @ z).reshape(self.kv_heads, d)
        if self.prefix + "self_attn.q_norm.weight" in w:
            q = _rms(q, self.p("self_attn.q_norm.weight"), eps)
            k = _rms(k, self.p("self_attn.k_norm.weight"), eps)
        q, k = _rope(q, pos, self.theta), _rope(k, pos, self.theta)
        cache = self.kv.setdefault(slot, {})
        cache[pos] = (k, v)
        keys = sorted(p for p in cache if p <= pos)
        ks = np.stack([cache[p][0] for p in keys])  # [S, G, D]
        vs = np.stack([cache[p][1] for p in keys])
        group = self.heads // self.kv_heads
        out = np.empty((self.heads, d))
        for j in range(self.heads):
            s = ks[:, j // group] @ q[j] / np.sqrt(d)
            prob = np.exp(s - s.max())
            out[j] = (prob / prob.sum()) @ vs[:, j // group]
        r = (h if self.nbr else x) + self.p("self_attn.o_proj.weight") @ out.reshape(-1)
        m = _rms(r, self.p("post_attention_layernorm.weight"), eps)
        gate, up = self.p("mlp.gate_proj.weight") @ m, self.p("mlp.up_proj.weight") @ m
        r = r + self.p("mlp.down_proj.weight") @ (gate / (1 + np.exp(-gate)) * up)
        normed = _rms(r, w["norm.weight"], eps)
        return w["lm_head.weight"] @ normed, (normed if self.norm_output else r)


# --- drafters under test --------------------------------------------------------------------

def _randomize(model, seed):
    """Weights of a realistic scale (1/sqrt(fan_in)), norms away from 1 so they matter."""
    rng = np.random.default_rng(seed)

    def draw(path, x):
        name = str(path[-1])
        if "norm" in name:
            return jnp.asarray(1.0 + 0.3 * rng.standard_normal(x.shape), x.dtype)
        if "bias" in name:
            return jnp.asarray(0.3 * rng.standard_normal(x.shape), x.dtype)
        fan_in = x.shape[0]
        return jnp.asarray(rng.standard_normal(x.shape) / np.sqrt(fan_in), x.dtype)

    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree_util.tree_map_with_path(draw, state))


def _d2t(rng, vd, v):
    """Offsets for the vd ids kept, sorted by id (so d2t is non-decreasing and >= 0)."""
    kept = np.sort(rng.choice(v, size=vd, replace=False))
    return (kept - np.arange(vd)).astype(np.int64)


def _saved_drafter(directory, target_cfg, *, layout, seed, with_embed=False, **flags):
    cfg = Eagle3Config.for_target(target_cfg, intermediate_size=96, draft_vocab_size=VD,
                                  rope_theta=50_000.0, **flags)
    model = Eagle3(cfg, with_embed=with_embed, rngs=nnx.Rngs(seed))
    _randomize(model, seed)
    model.d2t.set_value(jnp.asarray(_d2t(np.random.default_rng(seed), VD, cfg.vocab_size),
                                    jnp.int32))
    save_eagle3_hf(model, directory, layout=layout)


def _handwritten_legacy(directory, target_cfg, seed=7):
    """A legacy checkpoint written key by key, independent of save_eagle3_hf: no rope_theta
    (so 10000), no embed_tokens (the target's is used), SGLang-convention layer ids."""
    rng = np.random.default_rng(seed)
    h, q, g, d, i = 64, 4, 2, 32, 80
    v = target_cfg.vocab_size

    def lin(out, inp):
        return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    d2t = _d2t(rng, VD, v)
    t2d = np.zeros(v, np.bool_)
    t2d[np.arange(VD) + d2t] = True
    tensors = {
        "fc.weight": lin(h, 3 * h),
        "midlayer.self_attn.q_proj.weight": lin(q * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": lin(g * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": lin(g * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": lin(h, q * d),
        "midlayer.mlp.gate_proj.weight": lin(i, h),
        "midlayer.mlp.up_proj.weight": lin(i, h),
        "midlayer.mlp.down_proj.weight": lin(h, i),
        "midlayer.input_layernorm.weight": norm(h),
        "midlayer.hidden_norm.weight": norm(h),
        "midlayer.post_attention_layernorm.weight": norm(h),
        "norm.weight": norm(h),
        "lm_head.weight": lin(VD, h),
        "d2t": d2t,
        "t2d": t2d,
    }
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": h, "intermediate_size": i, "num_hidden_layers": 1,
        "num_attention_heads": q, "num_key_value_heads": g, "head_dim": d,
        "rms_norm_eps": 1e-6, "vocab_size": v, "draft_vocab_size": VD,
        "max_position_embeddings": 512, "tie_word_embeddings": False, "hidden_act": "silu",
        "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
    }
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


VARIANTS = {
    "legacy_fc_bias_norm_before_residual":
        dict(layout="legacy", fc_bias=True, norm_before_residual=True),
    "speculators_qk_norm_output_own_embed":
        dict(layout="speculators", qk_norm=True, norm_output=True, with_embed=True),
    "speculators_llama_norm_before_residual":
        dict(layout="speculators", norm_before_residual=True),
    "legacy_handwritten": None,
}


@pytest.fixture(scope="module")
def target(hf_checkpoints):
    directory, hf_model = hf_checkpoints["untied_sharded"]
    return load_qwen3(directory), hf_model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def drafter(request, target, tmp_path_factory):
    model, _ = target
    directory = str(tmp_path_factory.mktemp(request.param))
    flags = VARIANTS[request.param]
    if flags is None:
        _handwritten_legacy(directory, model.config)
    else:
        _saved_drafter(directory, model.config, seed=len(request.param), **flags)
    return directory, load_eagle3(directory, target_config=model.config)


def test_config_reads_layer_ids_and_flags(drafter):
    _, model = drafter
    assert model.config.aux_layer_ids == (2, 4, 5)  # distinct at L = 8


def test_matches_reference_over_chunked_step0_and_chained_steps(target, drafter):
    """Step 0 over prompts in two slots (chunked, interleaved, padded), then two chained draft
    steps from the carried state, against the float64 reference row by row."""
    target_model, hf_model = target
    directory, model = drafter
    target_embed = hf_model.model.embed_tokens.weight.detach().double().numpy()
    ref = ReferenceDrafter(directory, target_embed)
    embed = None if model.embed is not None else target_model.embed[...]
    rng = np.random.default_rng(0)
    lengths = {0: 12, 2: 8}  # slot -> prompt length
    prompts = {s: rng.integers(0, 256, size=n) for s, n in lengths.items()}

    ours_feat, ref_feat = {}, {}
    for s, prompt in prompts.items():
        n = len(prompt)
        out = target_model(jnp.asarray(prompt, jnp.int32), jnp.arange(n, dtype=jnp.int32),
                           jnp.zeros(n, jnp.int32), target_model.new_cache(num_slots=1, max_len=32),
                           aux_layers=model.config.aux_layer_ids)
        ours_feat[s] = np.asarray(out.aux_hidden)  # [n, A*H]
        with torch.no_grad():
            hs = hf_model(torch.tensor(prompt)[None], output_hidden_states=True).hidden_states
        ref_feat[s] = np.concatenate([hs[j][0].double().numpy() for j in ref.aux], axis=-1)

    def check(got, want, what):
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=what)

    # Step 0: draft row t reads (feature t, token t+1) at position t.
    cache = model.new_cache(num_slots=NUM_SLOTS, max_len=32)
    done = {s: 0 for s in prompts}
    last = {}
    for chunk in (5, 3, 100):
        rows = [(s, t) for s in prompts for t in range(done[s], min(done[s] + chunk,
                                                                     lengths[s] - 1))]
        pad = STEP0_ROWS - len(rows)
        tokens = [prompts[s][t + 1] for s, t in rows] + [0] * pad
        feats = np.stack([ours_feat[s][t] for s, t in rows] + [ours_feat[0][0]] * pad)
        slots = [s for s, _ in rows] + [NUM_SLOTS] * pad
        positions = [t for _, t in rows] + [0] * pad
        out = _step(model, jnp.asarray(tokens, jnp.int32), jnp.asarray(feats),
                    jnp.asarray(positions, jnp.int32), jnp.asarray(slots, jnp.int32), cache,
                    embed, from_features=True)
        cache = out.cache
        for i, (s, t) in enumerate(rows):
            want_logits, want_state = ref.step(s, prompts[s][t + 1], ref_feat[s][t], t, True)
            check(np.asarray(out.logits[i]), want_logits, f"step 0 logits slot {s} row {t}")
            check(np.asarray(out.state[i]), want_state, f"step 0 state slot {s} row {t}")
            last[s] = (np.asarray(out.state[i]), want_state, want_logits, t)
            done[s] = t + 1
    assert all(done[s] == lengths[s] - 1 for s in prompts)

    # Steps 1 and 2: the previous draft (as a target id) with the carried state, position + 1.
    for step in (1, 2):
        order = sorted(last)
        draft = np.array([int(np.argmax(last[s][2])) for s in order])
        target_ids = np.asarray(model.draft_to_target(jnp.asarray(draft, jnp.int32)))
        assert list(target_ids) == [ref.to_target(t) for t in draft]
        positions = [last[s][3] + 1 for s in order]
        states = np.stack([last[s][0] for s in order])  # [2, H] our carried states
        out = _step(model, jnp.asarray(target_ids, jnp.int32), jnp.asarray(states),
                    jnp.asarray(positions, jnp.int32), jnp.asarray(order, jnp.int32), cache,
                    embed, from_features=False)
        cache = out.cache
        for i, s in enumerate(order):
            want_logits, want_state = ref.step(s, target_ids[i], last[s][1], positions[i], False)
            check(np.asarray(out.logits[i]), want_logits, f"step {step} logits slot {s}")
            check(np.asarray(out.state[i]), want_state, f"step {step} state slot {s}")
            last[s] = (np.asarray(out.state[i]), want_state, want_logits, positions[i])


def test_cache_writes_alone_equal_the_forwards(target, drafter):
    """write_cache (the engine's floor step) leaves the cache exactly as a from-features
    forward over the same rows does, padding rows included (their writes are dropped)."""
    target_model, _ = target
    _, model = drafter
    embed = None if model.embed is not None else target_model.embed[...]
    rng = np.random.default_rng(1)
    rows = 6
    tokens = jnp.asarray(rng.integers(0, 256, size=rows), jnp.int32)
    feats = jnp.asarray(rng.standard_normal((rows, model.config.feature_size)), jnp.float32)
    slots = jnp.asarray([0, 0, 2, 1, NUM_SLOTS, 2], jnp.int32)
    positions = jnp.asarray([3, 4, 0, 7, 0, 1], jnp.int32)
    start = model.new_cache(num_slots=NUM_SLOTS, max_len=16)
    start = type(start)(*(x + 0.5 for x in start))  # earlier contents, not zeros
    full = model(tokens, feats, positions, slots, start, embed=embed, from_features=True).cache
    alone = model.write_cache(tokens, feats, positions, slots, start, embed=embed)
    for got, want in zip(alone, full):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert not np.array_equal(np.asarray(alone.k), np.asarray(start.k))  # it wrote


def test_draft_vocab_maps_to_target_ids(drafter):
    directory, model = drafter
    d2t = load_file(os.path.join(directory, "model.safetensors"))["d2t"]
    assert d2t.dtype == np.int64 and np.all(np.diff(d2t) >= 0) and d2t.max() > 0
    ids = np.arange(VD)
    np.testing.assert_array_equal(np.asarray(model.draft_to_target(jnp.asarray(ids))), ids + d2t)


def test_wrong_hidden_width_is_refused(drafter):
    _, model = drafter
    cache = model.new_cache(num_slots=1, max_len=8)
    rows = jnp.zeros(2, jnp.int32)
    with pytest.raises(ValueError, match=r"from_features=False expects the carried state \[T, H\]"):
        model(rows, jnp.zeros((2, 192)), rows, rows, cache, embed=jnp.zeros((256, 64)),
              from_features=False)


def test_real_size_drafter_builds_abstractly():
    """SpecForge's Qwen3-8B drafter shapes (reference/checkpoint-formats.md §2.3), jitted."""
    from lightspec_jax.models import PRESETS

    cfg = Eagle3Config.for_target(PRESETS["qwen3-8b"], draft_vocab_size=32000)
    model = nnx.eval_shape(lambda: Eagle3(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    h, i = 4096, 12288
    expected = (h * 3 * h + 2 * h * (h + 2 * 1024) + h * h + 3 * h * i + h * 32000 + 4 * h)
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert count == expected
    graphdef, state = nnx.split(model)

    def step(state, tokens, hidden, rows, *, from_features):
        m = nnx.merge(graphdef, state)
        return m(tokens, hidden, rows, rows, m.new_cache(num_slots=2, max_len=8),
                 embed=jnp.zeros((cfg.vocab_size, h), jnp.bfloat16), from_features=from_features)

    rows = jax.ShapeDtypeStruct((4,), jnp.int32)
    out = jax.eval_shape(lambda s, t, x, r: step(s, t, x, r, from_features=True), state, rows,
                         jax.ShapeDtypeStruct((4, 3 * h), jnp.bfloat16), rows)
    assert out.logits.shape == (4, 32000) and out.logits.dtype == jnp.float32
    assert out.state.shape == (4, h) and out.cache.k.shape == (1, 2, 8, 8, 128)
