"""Eagle3 drafter checkpoints: both HF layouts, layer-id conventions, round trips, and a clear
refusal for each drafter that cannot serve the target."""

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

from lightspec_jax.checkpoint import CheckpointError, load_eagle3, save_eagle3_hf
from lightspec_jax.checkpoint.eagle3 import LAYER_MAP
from lightspec_jax.models import PRESETS, Eagle3, Eagle3Config
from lightspec_jax.models.eagle3 import layer_param_shapes

TARGET = PRESETS["tiny"]  # V 512, H 64, L 8
VD = 100
WEIGHTS = "model.safetensors"


def _drafter(*, seed=0, with_embed=False, **flags):
    cfg = Eagle3Config.for_target(TARGET, draft_vocab_size=VD, **flags)
    model = Eagle3(cfg, with_embed=with_embed, rngs=nnx.Rngs(seed))
    kept = np.sort(np.random.default_rng(seed).choice(TARGET.vocab_size, VD, replace=False))
    model.d2t.set_value(jnp.asarray(kept - np.arange(VD), jnp.int32))
    return model


def _saved(path, layout="legacy", **flags):
    save_eagle3_hf(_drafter(**flags), str(path), layout=layout)
    return path


def _edit_config(path, fn):
    config = json.loads((path / "config.json").read_text())
    fn(config)
    (path / "config.json").write_text(json.dumps(config))


def _edit_tensors(path, fn):
    tensors = load_file(str(path / WEIGHTS))
    fn(tensors)
    save_file(tensors, str(path / WEIGHTS), metadata={"format": "pt"})


@functools.partial(nnx.jit, static_argnames="from_features")
def _step(model, tokens, hidden, positions, slots, cache, embed, *, from_features):
    return model(tokens, hidden, positions, slots, cache, embed=embed, from_features=from_features)


def _outputs(model, embed=None):
    """Step 0 over five rows in two slots, then one chained step."""
    rng = np.random.default_rng(0)
    embed = embed if embed is not None or model.embed is not None else jnp.asarray(
        rng.standard_normal((TARGET.vocab_size, TARGET.hidden_size)), model.dtype)
    cache = model.new_cache(num_slots=2, max_len=16)
    tokens = jnp.asarray([5, 9, 300, 7, 11], jnp.int32)
    positions = jnp.asarray([0, 1, 0, 2, 1], jnp.int32)
    slots = jnp.asarray([0, 0, 1, 0, 1], jnp.int32)
    feats = jnp.asarray(rng.standard_normal((5, model.config.feature_size)), jnp.float32)
    out0 = _step(model, tokens, feats, positions, slots, cache, embed, from_features=True)
    nxt = model.draft_to_target(jnp.argmax(out0.logits[jnp.array([3, 4])], axis=-1))
    out1 = _step(model, nxt, out0.state[jnp.array([3, 4])], jnp.asarray([3, 2], jnp.int32),
                 jnp.asarray([0, 1], jnp.int32), out0.cache, embed, from_features=False)
    return [np.asarray(x, np.float32) for x in (out0.logits, out0.state, out1.logits, out1.state)]


def _assert_same(a, b):
    for x, y in zip(_outputs(a), _outputs(b)):
        np.testing.assert_array_equal(x, y)


def test_layer_table_covers_every_layer_parameter():
    cfg = Eagle3Config.for_target(TARGET, qk_norm=True)
    assert sorted(ours for ours, _ in LAYER_MAP.values()) == sorted(layer_param_shapes(cfg))


@pytest.mark.parametrize("layout,flags", [
    ("legacy", dict(fc_bias=True, with_embed=True)),
    ("legacy", dict(norm_before_residual=True)),
    ("speculators", dict(qk_norm=True, norm_output=True, norm_before_residual=True)),
])
def test_save_load_round_trip_is_exact(tmp_path, layout, flags):
    model = _drafter(**flags)
    save_eagle3_hf(model, str(tmp_path), layout=layout)
    loaded = load_eagle3(str(tmp_path), target_config=TARGET)
    assert loaded.config == model.config
    np.testing.assert_array_equal(np.asarray(loaded.d2t[...]), np.asarray(model.d2t[...]))
    _assert_same(model, loaded)
    header = load_file(str(tmp_path / WEIGHTS))
    assert header["d2t"].dtype == np.int64 and header["t2d"].dtype == np.bool_
    assert header["t2d"].sum() == VD


def test_legacy_to_speculators_conversion_keeps_outputs(tmp_path):
    legacy = load_eagle3(str(_saved(tmp_path / "legacy")), target_config=TARGET)
    save_eagle3_hf(legacy, str(tmp_path / "spec"), layout="speculators")
    spec = load_eagle3(str(tmp_path / "spec"), target_config=TARGET)
    assert any(k.startswith("layers.0.") for k in load_file(str(tmp_path / "spec" / WEIGHTS)))
    _assert_same(legacy, spec)


@pytest.mark.parametrize("layout,ids,ours", [
    ("legacy", [0, 3, 5], (1, 4, 6)),  # SGLang: output of layer i = input of layer i + 1
    ("speculators", [0, 3, 5], (0, 3, 5)),  # HF hidden_states index = ours
    ("speculators", [5, 2, 4], (2, 4, 5)),  # engines concatenate in layer order
    ("legacy", None, (2, 4, 5)),  # default 2, L//2, L-3
    ("speculators", None, (2, 4, 5)),
])
def test_layer_id_conventions(tmp_path, layout, ids, ours):
    path = _saved(tmp_path, layout)

    def set_ids(c):
        if layout == "legacy":
            c.pop("eagle_config")
            if ids is not None:
                c["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
        else:
            c["eagle_aux_hidden_state_layer_ids"] = ids

    _edit_config(path, set_ids)
    assert load_eagle3(str(path), target_config=TARGET).config.aux_layer_ids == ours


def test_bf16_load(tmp_path):
    path = _saved(tmp_path, "speculators", qk_norm=True)
    ref = load_eagle3(str(path), target_config=TARGET)
    model = load_eagle3(str(path), target_config=TARGET, dtype="bfloat16")
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    assert model.d2t[...].dtype == jnp.int32
    got, want = _outputs(model)[0], _outputs(ref)[0]
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max() + 0.05


def test_sharded_and_torch_files_load_the_same(tmp_path):
    path = _saved(tmp_path / "single", with_embed=True)
    ref = load_eagle3(str(path), target_config=TARGET)
    tensors = load_file(str(path / WEIGHTS))
    names = sorted(tensors)
    for layout in ("sharded", "torch"):
        out = tmp_path / layout
        out.mkdir()
        (out / "config.json").write_text((path / "config.json").read_text())
        if layout == "sharded":
            files = {n: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, n in enumerate(names)}
            for f in set(files.values()):
                save_file({n: tensors[n] for n in names if files[n] == f}, str(out / f))
            (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": files}))
        else:
            torch.save({n: torch.from_numpy(v) for n, v in tensors.items()},
                       str(out / "pytorch_model.bin"))
        _assert_same(ref, load_eagle3(str(out), target_config=TARGET))


def test_without_embedding_the_target_one_is_required(tmp_path):
    path = _saved(tmp_path, with_embed=True)
    model = load_eagle3(str(path), target_config=TARGET, load_embed=False)
    assert model.embed is None
    rows = jnp.zeros(1, jnp.int32)
    with pytest.raises(ValueError, match="no embedding of its own: pass the target's"):
        model(rows, jnp.zeros((1, 192)), rows, rows, model.new_cache(num_slots=1, max_len=8),
              embed=None, from_features=True)


def test_full_draft_vocab_without_d2t_is_identity(tmp_path):
    path = _saved(tmp_path)
    _edit_config(path, lambda c: c.pop("draft_vocab_size"))
    _edit_tensors(path, lambda t: (t.pop("d2t"), t.pop("t2d"),
                                   t.update({"lm_head.weight": np.zeros((512, 64), np.float32)})))
    model = load_eagle3(str(path), target_config=TARGET)
    ids = jnp.arange(512)
    np.testing.assert_array_equal(np.asarray(model.draft_to_target(ids)), np.asarray(ids))


def test_save_refuses_what_the_layout_cannot_express(tmp_path):
    with pytest.raises(ValueError, match="legacy .* has no q_norm/k_norm"):
        save_eagle3_hf(_drafter(qk_norm=True), str(tmp_path), layout="legacy")
    with pytest.raises(ValueError, match="speculators layout has no fc bias"):
        save_eagle3_hf(_drafter(fc_bias=True), str(tmp_path), layout="speculators")


# --- refusals: each names what is wrong -------------------------------------------------------

def _cfg(**kw):
    return lambda c: c.update(kw)


def _spec_ids(ids):
    return lambda c: c.update(eagle_aux_hidden_state_layer_ids=ids)


def _legacy_ids(ids):
    return lambda c: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": ids})


def _bad_d2t(t):
    t["d2t"][-1] = 1000


def _extra_layer(t):
    t["layers.1.mlp.up_proj.weight"] = t["layers.0.mlp.up_proj.weight"]


CONFIG_REFUSALS = {
    "hidden_size": ("legacy", _cfg(hidden_size=32),
                    r"hidden_size=32 does not match the target's hidden_size=64"),
    "target_hidden_size": ("speculators", _cfg(target_hidden_size=128),
                           r"target_hidden_size=128 does not match the target's hidden_size=64"),
    "vocab_size": ("legacy", _cfg(vocab_size=1000),
                   r"vocab_size=1000 does not match the target's vocab_size=512"),
    "legacy_ids_out_of_range": ("legacy", _legacy_ids([1, 3, 7]),
                                r"lists 7, which is the input of target layer 8: outside \[0, 8\)"),
    "speculators_ids_out_of_range": ("speculators", _spec_ids([2, 4, 8]),
                                     r"lists 8, .* layer 8: outside \[0, 8\)"),
    "repeated_ids": ("speculators", _spec_ids([2, 4, 4]), r"\[2, 4, 4\] repeats a layer"),
    "ids_count_vs_fc": ("legacy", _legacy_ids([1, 3]),
                        r"fc\.weight .* takes 192 input features, but the 2 aux layers \[2, 4\] "
                        r"x target hidden size 64 give 128 \(the checkpoint was trained on 3"),
    "tied": ("legacy", _cfg(tie_word_embeddings=True),
             r"tie_word_embeddings=true with draft_vocab_size=100 != vocab_size=512"),
    "two_layers": ("legacy", _cfg(num_hidden_layers=2),
                   r"num_hidden_layers=2: only single-layer Eagle3 drafters are supported"),
    "architecture": ("legacy", _cfg(architectures=["LlamaForCausalLM"]),
                     r"unsupported architecture: architectures=\['LlamaForCausalLM'\]"),
    "layout_mismatch": ("legacy", _cfg(architectures=["Eagle3Speculator"],
                                       transformer_layer_config={"hidden_size": 64,
                                           "intermediate_size": 128, "num_attention_heads": 4,
                                           "num_key_value_heads": 2, "head_dim": 32,
                                           "vocab_size": 512}),
                        r"missing tensor 'layers\.0\..* 'midlayer\.' prefix of the other layout"),
    "yarn": ("speculators", lambda c: c["transformer_layer_config"].update(
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
        r"rope_type='yarn' is not supported"),
    "wrong_shape": ("legacy", _cfg(intermediate_size=96),
                    r"'midlayer\.mlp\.gate_proj\.weight' .* shape \[128, 64\], "
                    r"expected \[96, 64\]"),
}
TENSOR_REFUSALS = {
    "missing_key": ("legacy", lambda t: t.pop("midlayer.mlp.up_proj.weight"),
                    r"missing tensor 'midlayer\.mlp\.up_proj\.weight'"),
    "missing_d2t": ("legacy", lambda t: t.pop("d2t"),
                    r"missing tensor 'd2t' .* draft_vocab_size=100 < vocab_size=512"),
    "d2t_out_of_range": ("legacy", _bad_d2t,
                         r"d2t .* maps draft id 99 to target id 1099, outside \[0, 512\)"),
    "extra_layer": ("speculators", _extra_layer,
                    r"more than one decoder layer .*'layers\.1\.mlp\.up_proj\.weight'"
                    r".*unsupported"),
    "unexpected_bias": ("legacy", lambda t: t.update({"fc.bias": np.zeros(64, np.float32)}),
                        r"unexpected tensor 'fc\.bias' .* does not set bias=true"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_REFUSALS))
def test_bad_config_is_refused(tmp_path, case):
    layout, edit, message = CONFIG_REFUSALS[case]
    path = _saved(tmp_path, layout)
    _edit_config(path, edit)
    with pytest.raises(CheckpointError, match=message):
        load_eagle3(str(path), target_config=TARGET)


@pytest.mark.parametrize("case", sorted(TENSOR_REFUSALS))
def test_bad_tensors_are_refused(tmp_path, case):
    layout, edit, message = TENSOR_REFUSALS[case]
    path = _saved(tmp_path, layout)
    _edit_tensors(path, edit)
    with pytest.raises(CheckpointError, match=message):
        load_eagle3(str(path), target_config=TARGET)


def test_missing_weights_and_directory(tmp_path):
    path = _saved(tmp_path / "d")
    os.remove(path / WEIGHTS)
    with pytest.raises(CheckpointError, match="no weights .*pytorch_model.bin"):
        load_eagle3(str(path), target_config=TARGET)
    with pytest.raises(CheckpointError, match="not a directory"):
        load_eagle3(str(tmp_path / "nowhere"), target_config=TARGET)
