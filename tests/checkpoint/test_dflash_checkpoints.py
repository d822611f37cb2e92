"""DFlash drafter checkpoints in the z-lab layout: weights land where the model reads them
(single file, sharded, bf16), the config's defaults, and a clear refusal for each drafter that
cannot serve the target."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from dflash_fixtures import edit_config, edit_tensors, write_zlab_dflash
from lightspec_jax.checkpoint import (DFLASH, CheckpointError, drafter_kind, load_dflash,
                                      save_dflash_hf)
from lightspec_jax.models import PRESETS, default_target_layer_ids

TARGET = PRESETS["tiny"]  # V 512, H 64, L 8, 4/2 heads, head_dim 32
SHAPE = dict(target_layers=TARGET.num_layers, vocab_size=TARGET.vocab_size)


def _write(path, **kw):
    return write_zlab_dflash(str(path), **{**SHAPE, "target_layer_ids": (1, 4, 7), **kw})


def test_weights_land_in_our_layout_and_round_trip(tmp_path):
    written = _write(tmp_path / "a", num_layers=3, block_size=16, mask_token_id=500)
    assert drafter_kind(str(tmp_path / "a")) == DFLASH
    model = load_dflash(str(tmp_path / "a"), target_config=TARGET)
    cfg = model.config
    assert (cfg.block_size, cfg.mask_token_id, cfg.num_layers) == (16, 500, 3)
    assert cfg.target_layer_ids == (1, 4, 7) and cfg.aux_layers == (2, 5, 8)
    assert cfg.rope_theta == 50_000.0 and cfg.feature_size == 3 * 64
    # torch [out, in] -> [in, out]; q/k/v [heads*D, H] -> [H, heads, D], stacked over layers.
    np.testing.assert_array_equal(np.asarray(model.fc[...]), written["fc.weight"].T)
    q = written["layers.2.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(np.asarray(model.layers.q_proj[...])[2],
                                  q.T.reshape(64, 4, 32))
    np.testing.assert_array_equal(np.asarray(model.layers.post_norm[...])[1],
                                  written["layers.1.post_attention_layernorm.weight"])
    save_dflash_hf(model, str(tmp_path / "b"))
    again = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert set(again) == set(written)
    for name, value in written.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)
    assert load_dflash(str(tmp_path / "b"), target_config=TARGET).config == cfg


def test_bf16_and_sharded_checkpoints_load_the_same(tmp_path):
    written = _write(tmp_path / "bf16", dtype="bfloat16", shard=True)
    assert (tmp_path / "bf16" / "model.safetensors.index.json").exists()
    model = load_dflash(str(tmp_path / "bf16"), target_config=TARGET, dtype="bfloat16")
    assert model.dtype == jnp.bfloat16
    want = written["fc.weight"].astype(ml_dtypes.bfloat16).T
    np.testing.assert_array_equal(np.asarray(model.fc[...]), want)
    as_f32 = load_dflash(str(tmp_path / "bf16"), target_config=TARGET)
    assert as_f32.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(as_f32.layers.down_proj[...])[0],
                                  written["layers.0.mlp.down_proj.weight"]
                                  .astype(ml_dtypes.bfloat16).astype(np.float32).T)


def test_defaults_and_ignored_copies(tmp_path):
    # z-lab's class default ids: [1, 9, 17, 25, 33] for the 36-layer Qwen3-8B with 5 draft
    # layers (its shipped config lists the same), [1, 7, 13, 19, 25] and [1, 10, 19, 28, 37]
    # for 28 and 40 layers; the middle layer for a single draft layer.
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(28, 5) == (1, 7, 13, 19, 25)
    assert default_target_layer_ids(40, 5) == (1, 10, 19, 28, 37)
    assert default_target_layer_ids(8, 1) == (4,)
    extra = {"lm_head.weight": np.zeros((512, 64), np.float32),
             "embed_tokens.weight": np.zeros((512, 64), np.float32)}
    write_zlab_dflash(str(tmp_path), **SHAPE, num_layers=2, extra=extra)  # no ids in config
    model = load_dflash(str(tmp_path), target_config=TARGET)
    assert model.config.target_layer_ids == (1, 5)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(hidden_size=32), "hidden_size=32 does not match the target's 64"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 4, 8]),
     r"name layer 8, outside \[0, 8\) for the 8-layer target"),
    (lambda c: c["dflash_config"].update(mask_token_id=512),
     r"mask_token_id=512 is outside the vocabulary \[0, 512\)"),
    (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id is missing"),
    (lambda c: c.update(num_target_layers=36), "num_target_layers=36 does not match the "
                                               "target's 8 layers"),
    (lambda c: c.update(block_size=1), "block_size must be an int >= 2"),
    (lambda c: c.update(use_sliding_window=True), "sliding-window draft layers"),
    (lambda c: c.update(vocab_size=1000), "vocab_size=1000 does not match the target's 512"),
])
def test_a_drafter_for_another_target_is_refused(tmp_path, edit, match):
    _write(tmp_path)
    edit_config(tmp_path, edit)
    with pytest.raises(CheckpointError, match=match):
        load_dflash(str(tmp_path), target_config=TARGET)


def test_tensor_mismatches_are_refused(tmp_path):
    _write(tmp_path)
    edit_config(tmp_path, lambda c: c["dflash_config"].update(target_layer_ids=[1, 4]))
    with pytest.raises(CheckpointError, match=r"'fc.weight' .* has shape \[64, 192\], "
                                              r"expected \[64, 128\]"):
        load_dflash(str(tmp_path), target_config=TARGET)
    edit_config(tmp_path, lambda c: c["dflash_config"].update(target_layer_ids=[1, 4, 7]))
    edit_tensors(tmp_path, lambda t: t.update({"layers.2.mlp.up_proj.weight":
                                                np.zeros((96, 64), np.float32)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'layers.2.mlp.up_proj.weight'"
                                              r".*num_hidden_layers=2"):
        load_dflash(str(tmp_path), target_config=TARGET)
    edit_tensors(tmp_path, lambda t: t.update({"model." + k: t.pop(k) for k in list(t)}))
    with pytest.raises(CheckpointError, match="missing tensor .*'model.' prefix"):
        load_dflash(str(tmp_path), target_config=TARGET)
