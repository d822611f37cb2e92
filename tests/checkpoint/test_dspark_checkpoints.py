"""DSpark drafter checkpoints in the DeepSpec layout: weights (body and both heads) land where the
model reads them (single file, sharded, bf16), the writer round-trips, drafter_kind tells DSpark
from DFlash and a draft LM, and each drafter that cannot serve the target is refused clearly."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from dflash_fixtures import edit_config, edit_tensors, write_zlab_dflash
from dspark_fixtures import write_deepspec_dspark
from lightspec_jax import SpeculativeConfig
from lightspec_jax.checkpoint import (DFLASH, DSPARK, CheckpointError, drafter_kind,
                                      load_dspark, save_dspark_hf)
from lightspec_jax.models import PRESETS

TARGET = PRESETS["tiny"]  # V 512, H 64, L 8, 4/2 heads, head_dim 32
SHAPE = dict(target_layers=TARGET.num_layers, vocab_size=TARGET.vocab_size)


def _write(path, **kw):
    return write_deepspec_dspark(str(path), **{**SHAPE, "target_layer_ids": (-1, 4, 7), **kw})


def test_weights_land_in_our_layout_and_round_trip(tmp_path):
    copies = {"embed_tokens.weight": np.zeros((512, 64), np.float32),
              "lm_head.weight": np.zeros((512, 64), np.float32)}  # DeepSpec saves both
    written = _write(tmp_path / "a", num_layers=3, block_size=7, mask_token_id=500,
                     markov_rank=16, extra=copies)
    assert drafter_kind(str(tmp_path / "a")) == DSPARK
    model = load_dspark(str(tmp_path / "a"), target_config=TARGET)
    cfg = model.config
    assert (cfg.block_size, cfg.mask_token_id, cfg.num_layers, cfg.markov_rank) == (7, 500, 3, 16)
    assert cfg.confidence_head and cfg.confidence_head_with_markov
    # -1 is the embedding output: the residual entering layer 0.
    assert cfg.target_layer_ids == (-1, 4, 7) and cfg.aux_layers == (0, 5, 8)
    np.testing.assert_array_equal(np.asarray(model.fc[...]), written["fc.weight"].T)
    np.testing.assert_array_equal(np.asarray(model.markov_w1[...]),
                                  written["markov_head.markov_w1.weight"])
    np.testing.assert_array_equal(np.asarray(model.markov_w2[...]),
                                  written["markov_head.markov_w2.weight"].T)  # [r, V]
    np.testing.assert_array_equal(np.asarray(model.confidence_w[...]),
                                  written["confidence_head.proj.weight"].T)  # [H+r, 1]
    np.testing.assert_array_equal(np.asarray(model.confidence_b[...]),
                                  written["confidence_head.proj.bias"])
    save_dspark_hf(model, str(tmp_path / "b"), num_target_layers=TARGET.num_layers)
    again = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert set(again) == set(written)
    for name, value in written.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)
    assert drafter_kind(str(tmp_path / "b")) == DSPARK
    assert load_dspark(str(tmp_path / "b"), target_config=TARGET).config == cfg


@pytest.mark.parametrize("rank, confidence, with_markov", [(0, False, False), (8, False, False),
                                                           (0, True, False), (8, True, False)])
def test_optional_heads(tmp_path, rank, confidence, with_markov):
    written = _write(tmp_path, markov_rank=rank, confidence=confidence, with_markov=with_markov)
    model = load_dspark(str(tmp_path), target_config=TARGET)
    assert (model.markov_w1 is None) == (rank == 0)
    assert (model.confidence_w is None) == (not confidence)
    if confidence:  # without the Markov features the head reads h alone
        assert model.confidence_w.shape == (64, 1)
    save_dspark_hf(model, str(tmp_path / "again"))
    assert set(load_file(str(tmp_path / "again" / "model.safetensors"))) == set(written)


def test_bf16_and_sharded_checkpoints_load_the_same(tmp_path):
    written = _write(tmp_path, dtype="bfloat16", shard=True)
    assert (tmp_path / "model.safetensors.index.json").exists()
    model = load_dspark(str(tmp_path), target_config=TARGET, dtype="bfloat16")
    assert model.dtype == jnp.bfloat16 and model.markov_w2.dtype == jnp.bfloat16
    want = written["markov_head.markov_w2.weight"].astype(ml_dtypes.bfloat16).T
    np.testing.assert_array_equal(np.asarray(model.markov_w2[...]), want)
    as_f32 = load_dspark(str(tmp_path), target_config=TARGET)
    np.testing.assert_array_equal(np.asarray(as_f32.layers.down_proj[...])[1],
                                  written["layers.1.mlp.down_proj.weight"]
                                  .astype(ml_dtypes.bfloat16).astype(np.float32).T)


def test_kind_and_method(tmp_path):
    write_zlab_dflash(str(tmp_path / "dflash"), **SHAPE)
    _write(tmp_path / "dspark")
    assert drafter_kind(str(tmp_path / "dflash")) == DFLASH
    assert drafter_kind(str(tmp_path / "dspark")) == DSPARK
    assert SpeculativeConfig(policy="static", num_speculative_tokens=3,
                             method="dspark").method == "dspark"
    with pytest.raises(CheckpointError, match="is not a DSpark drafter"):
        load_dspark(str(tmp_path / "dflash"), target_config=TARGET)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(hidden_size=32), "hidden_size=32 does not match the target's 64: this "
                                         "DSpark drafter"),
    (lambda c: c.update(target_layer_ids=[1, 4, 8]),
     r"name layer 8, outside \[0, 8\) for the 8-layer target"),
    (lambda c: c.update(target_layer_ids=[-2, 4, 7]), r"distinct and >= -1"),
    (lambda c: c.update(target_layer_ids=[4, 1, 7]), "strictly increasing"),
    (lambda c: c.pop("target_layer_ids"), "lacks required field 'target_layer_ids'"),
    (lambda c: c.update(mask_token_id=512), r"mask_token_id=512 is outside the vocabulary "
                                            r"\[0, 512\)"),
    (lambda c: c.pop("mask_token_id"), "lacks required field 'mask_token_id'"),
    (lambda c: c.update(num_target_layers=36), "num_target_layers=36 does not match the "
                                               "target's 8 layers"),
    (lambda c: c.update(block_size=1), "block_size must be an int >= 2"),
    (lambda c: c.update(vocab_size=1000), "vocab_size=1000 does not match the target's 512"),
    (lambda c: c.update(use_sliding_window=True), "sliding-window draft layers"),
    (lambda c: c.update(markov_head_type="gated"), "markov_head_type='gated' is not supported"),
    (lambda c: c.pop("markov_head_type"), "markov_head_type is missing with markov_rank=8"),
    (lambda c: c.pop("confidence_head_with_markov"), "confidence_head_with_markov is missing"),
    (lambda c: c.update(markov_rank=0), "confidence_head_with_markov needs .* a Markov head"),
])
def test_a_drafter_for_another_target_is_refused(tmp_path, edit, match):
    _write(tmp_path)
    edit_config(tmp_path, edit)
    with pytest.raises(CheckpointError, match=match):
        load_dspark(str(tmp_path), target_config=TARGET)


def test_tensor_mismatches_are_refused(tmp_path):
    _write(tmp_path)
    edit_config(tmp_path, lambda c: c.update(markov_rank=4))
    with pytest.raises(CheckpointError, match=r"'markov_head.markov_w1.weight' .* has shape "
                                              r"\[512, 8\], expected \[512, 4\]"):
        load_dspark(str(tmp_path), target_config=TARGET)
    edit_config(tmp_path, lambda c: c.update(markov_rank=8))
    edit_tensors(tmp_path, lambda t: t.pop("confidence_head.proj.bias"))
    with pytest.raises(CheckpointError, match="missing tensor 'confidence_head.proj.bias'"):
        load_dspark(str(tmp_path), target_config=TARGET)
    edit_config(tmp_path, lambda c: c.update(enable_confidence_head=False))
    with pytest.raises(CheckpointError, match="unexpected tensor 'confidence_head.proj.weight'"):
        load_dspark(str(tmp_path), target_config=TARGET)
    edit_config(tmp_path, lambda c: c.update(enable_confidence_head=True))
    edit_tensors(tmp_path, lambda t: t.update({"model." + k: t.pop(k) for k in list(t)}))
    with pytest.raises(CheckpointError, match="missing tensor .*'model.' prefix"):
        load_dspark(str(tmp_path), target_config=TARGET)
