"""Loading, conversion round trips and clear failures for bad Hugging Face checkpoints."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lightspec_jax.checkpoint import CheckpointError, convert_qwen3, load_qwen3
from lightspec_jax.checkpoint.cli import main as convert_main
from lightspec_jax.checkpoint.qwen3 import LAYER_MAP
from lightspec_jax.models import PRESETS, Qwen3
from lightspec_jax.models.qwen3 import LAYER_PARAM_NAMES


def _logits(model, tokens):
    t = len(tokens)
    cache = model.new_cache(num_slots=1, max_len=32)
    out = model(jnp.asarray(tokens, jnp.int32), jnp.arange(t, dtype=jnp.int32),
                jnp.zeros(t, jnp.int32), cache)
    return np.asarray(out.logits)


TOKENS = [3, 17, 42, 5, 99, 7, 128, 64]


def test_layer_table_covers_every_stacked_parameter():
    assert sorted(ours for ours, _ in LAYER_MAP.values()) == sorted(LAYER_PARAM_NAMES)


def test_conversion_round_trip_gives_identical_logits(hf_checkpoint, tmp_path):
    directory, _ = hf_checkpoint
    direct = load_qwen3(directory)
    out = tmp_path / "converted"
    assert convert_main([directory, str(out), "--dtype", "float32"]) == 0
    assert (out / "lightspec.json").is_file() and (out / "config.json").is_file()
    restored = load_qwen3(str(out))
    np.testing.assert_array_equal(_logits(restored, TOKENS), _logits(direct, TOKENS))
    # A second conversion into the same place is refused rather than silently mixed.
    with pytest.raises(CheckpointError, match="already exists"):
        convert_qwen3(directory, str(out))


def test_bf16_loading(hf_checkpoint, tmp_path):
    directory, _ = hf_checkpoint
    model = load_qwen3(directory, dtype="bfloat16")
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.bfloat16)}
    ref = _logits(load_qwen3(directory), TOKENS)
    got = _logits(model, TOKENS)
    assert np.isfinite(got).all()
    # bf16 keeps ~3 significant digits; the argmax agrees where fp32 has a clear winner.
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max() + 0.05
    # A bf16 conversion restores as bf16 and converts on request.
    out = tmp_path / "bf16"
    convert_qwen3(directory, str(out), dtype="bfloat16")
    restored = load_qwen3(str(out))
    np.testing.assert_array_equal(_logits(restored, TOKENS), got)
    assert load_qwen3(str(out), dtype="float32").dtype == jnp.float32


def test_bf16_safetensors_files_load(tmp_path):
    """Real checkpoints store BF16 tensors; safetensors needs ml_dtypes to hand them to numpy."""
    import torch
    from hf_fixtures import TinySpec, build_hf_qwen3
    directory, hf_model = build_hf_qwen3(str(tmp_path / "fp32"), TinySpec(tied=True, seed=3))
    bf16_dir = str(tmp_path / "bf16")
    hf_model.to(torch.bfloat16).save_pretrained(bf16_dir)
    header = _safetensors_header(os.path.join(bf16_dir, "model.safetensors"))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    model = load_qwen3(bf16_dir, dtype="bfloat16")
    assert np.isfinite(_logits(model, TOKENS)).all()


def _safetensors_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_real_sizes_build_abstractly(name):
    cfg = PRESETS[name]
    model = nnx.eval_shape(lambda: Qwen3(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    expected = {"qwen3-0.6b": 0.596e9, "qwen3-1.7b": 1.72e9, "qwen3-4b": 4.02e9,
                "qwen3-8b": 8.19e9, "qwen3-14b": 14.77e9, "qwen3-32b": 32.76e9}
    if name in expected:
        assert abs(count - expected[name]) / expected[name] < 0.01, count
    graphdef, state = nnx.split(model)
    t = 4

    def forward(state, tokens, positions, slots):
        m = nnx.merge(graphdef, state)
        return m(tokens, positions, slots, m.new_cache(num_slots=2, max_len=8),
                 aux_layers=cfg.default_aux_layers)

    rows = jax.ShapeDtypeStruct((t,), jnp.int32)
    out = jax.eval_shape(forward, state, rows, rows, rows)
    assert out.logits.shape == (t, cfg.vocab_size)
    assert out.aux_hidden.shape == (t, 3 * cfg.hidden_size)


# --- bad checkpoints: each fails with a message naming the key or file ---------------------

@pytest.fixture
def broken(hf_checkpoints, tmp_path):
    """A fresh copy of the sharded checkpoint to damage."""
    src, _ = hf_checkpoints["untied_sharded"]
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _edit_json(path, fn):
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def test_missing_key(broken):
    index = broken / "model.safetensors.index.json"
    _edit_json(index, lambda d: d["weight_map"].pop("model.layers.3.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.3\.mlp\.up_proj\.weight'"):
        load_qwen3(str(broken))


def test_missing_untied_lm_head(broken):
    _edit_json(broken / "model.safetensors.index.json", lambda d: d["weight_map"].pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match="lm_head.weight.*tie_word_embeddings=false"):
        load_qwen3(str(broken))


def test_wrong_shape(broken):
    # The config claims a wider MLP than the tensors have.
    _edit_json(broken / "config.json", lambda d: d.update(intermediate_size=96))
    with pytest.raises(CheckpointError, match=r"mlp\.gate_proj\.weight.*shape \[128, 64\].*\[96, 64\]"):
        load_qwen3(str(broken))


def test_fewer_layers_in_config_than_checkpoint(broken):
    _edit_json(broken / "config.json", lambda d: d.update(num_hidden_layers=4))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.4\..*num_hidden_layers=4"):
        load_qwen3(str(broken))


def test_unknown_architecture(broken):
    _edit_json(broken / "config.json",
               lambda d: d.update(architectures=["LlamaForCausalLM"], model_type="llama"))
    with pytest.raises(CheckpointError, match="unsupported architecture.*LlamaForCausalLM"):
        load_qwen3(str(broken))


def test_sliding_window_refused(broken):
    _edit_json(broken / "config.json",
               lambda d: d.update(use_sliding_window=True, sliding_window=64, max_window_layers=2))
    with pytest.raises(CheckpointError, match="use_sliding_window"):
        load_qwen3(str(broken))


def test_yarn_refused(broken):
    _edit_json(broken / "config.json", lambda d: d.update(
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                         "original_max_position_embeddings": 32768}))
    with pytest.raises(CheckpointError, match="rope_type='yarn'"):
        load_qwen3(str(broken))


def test_truncated_shard(broken):
    shard = sorted(broken.glob("model-*.safetensors"))[3]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=shard.name):
        load_qwen3(str(broken))


def test_missing_shard_file(broken):
    shard = sorted(broken.glob("model-*.safetensors"))[2]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"missing shard .*{shard.name}"):
        load_qwen3(str(broken))


def test_no_weights_at_all(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["tiny"].to_hf()))
    with pytest.raises(CheckpointError, match="no weights"):
        load_qwen3(str(tmp_path))


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match="missing file .*config.json"):
        load_qwen3(str(tmp_path))


def test_v4_and_v5_rope_spellings_agree(broken):
    """v5 writes only rope_parameters; v4 files carry a top-level rope_theta."""
    cfg = json.loads((broken / "config.json").read_text())
    theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta"))
    assert theta == 12345.0
    ref = _logits(load_qwen3(str(broken)), TOKENS)

    def to_v4(d):
        d.pop("rope_parameters", None)
        d["rope_theta"] = theta
        d["rope_scaling"] = None
    _edit_json(broken / "config.json", to_v4)
    np.testing.assert_array_equal(_logits(load_qwen3(str(broken)), TOKENS), ref)


def test_convert_cli_reports_errors(tmp_path, capsys):
    assert convert_main([str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("shard", [None, 20_000])
def test_export_to_hf_round_trip(hf_checkpoint, tmp_path, shard):
    """Our HF writer is the loader's inverse, and transformers reads what it writes."""
    import torch
    from transformers import Qwen3ForCausalLM

    from lightspec_jax.checkpoint import save_qwen3_hf

    directory, hf_model = hf_checkpoint
    model = load_qwen3(directory)
    out = tmp_path / "exported"
    save_qwen3_hf(model, str(out), max_shard_bytes=shard)
    assert (out / ("model.safetensors" if shard is None else "model.safetensors.index.json")).is_file()
    np.testing.assert_array_equal(_logits(load_qwen3(str(out)), TOKENS), _logits(model, TOKENS))
    reread = Qwen3ForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf_model(torch.tensor([TOKENS])).logits[0].numpy()
        got = reread(torch.tensor([TOKENS])).logits[0].numpy()
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
