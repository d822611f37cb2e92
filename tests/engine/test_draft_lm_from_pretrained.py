"""Engine.from_pretrained with a Qwen3 draft LM as drafter_path: lossless, and refused when it
does not share the target's vocabulary.

The draft LMs are built here from the session's random target: its own weights with noise
added (right on most tokens, wrong on some: long accepted spans next to rejections) and an
unrelated small random Qwen3 (almost always wrong).
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from lightspec_jax.checkpoint import CheckpointError, load_qwen3, save_qwen3_hf
from lightspec_jax.drafters import DraftLMDrafter
from lightspec_jax.models import Qwen3, Qwen3Config

SPEC_CONFIG = EngineConfig(max_num_seqs=4, max_model_len=96, dtype="float32",
                           max_num_batched_tokens=24, verify_buckets=(4, 8, 16),
                           compilation_cache_dir=None, show_progress=False,
                           speculative=SpeculativeConfig(policy="static",
                                                         num_speculative_tokens=3))


def noisy_copy(target_dir, directory, *, scale, seed=0):
    """The target's weights plus Gaussian noise of `scale` x each tensor's own std."""
    model = load_qwen3(target_dir)
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    rng = np.random.default_rng(seed)
    noisy = [x + scale * float(np.std(x)) * rng.standard_normal(x.shape).astype(np.float32)
             for x in map(np.asarray, leaves)]
    nnx.update(model, jax.tree.unflatten(treedef, noisy))
    save_qwen3_hf(model, directory)
    return directory


def small_random(directory, *, vocab_size, seed=3):
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True)
    save_qwen3_hf(Qwen3(cfg, rngs=nnx.Rngs(seed)), directory)
    return directory


@pytest.fixture(scope="module")
def target_dir(hf_checkpoints):
    return hf_checkpoints["untied_sharded"][0]


@pytest.fixture(scope="module")
def plain(engines):
    return engines["untied_sharded"][0]


@pytest.mark.parametrize("drafter", ["noisy_copy", "small_random"])
def test_draft_lm_greedy_equals_plain_greedy(drafter, target_dir, plain, tmp_path):
    draft_dir = str(tmp_path / drafter)
    if drafter == "noisy_copy":
        noisy_copy(target_dir, draft_dir, scale=0.15)
    else:
        small_random(draft_dir, vocab_size=plain.vocab_size)
    engine = Engine.from_pretrained(target_dir, draft_dir, config=SPEC_CONFIG)
    assert isinstance(engine.drafter, DraftLMDrafter)
    rng = np.random.default_rng(1)
    # More prompts than slots: requests join as others finish.
    prompts = [rng.integers(2, plain.vocab_size, size=n).tolist() for n in (5, 31, 12, 1, 44, 8)]
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    outs = engine.generate(prompts, params)
    for out, ref in zip(outs, plain.generate(prompts, params)):
        assert out.token_ids == ref.token_ids
    accepted = sum(o.metrics.accepted for o in outs) / sum(o.metrics.verified for o in outs)
    if drafter == "noisy_copy":  # both paths taken: full spans and rejections
        assert 0.3 < accepted < 0.95, accepted
        assert any(s.accepted >= 3 for s in engine.stats.steps)


def test_draft_lm_with_another_vocabulary_is_refused(target_dir, plain, tmp_path):
    draft_dir = small_random(str(tmp_path / "draft"), vocab_size=plain.vocab_size + 8)
    with pytest.raises(CheckpointError, match=r"vocab_size=264, the target .* has 256: a draft "
                                              r"LM must share the target's vocabulary"):
        Engine.from_pretrained(target_dir, draft_dir, config=SPEC_CONFIG)


def _word_level(path, vocab):
    from tokenizers import Tokenizer, models
    Tokenizer(models.WordLevel(vocab, unk_token="a")).save(path)


def test_draft_lm_with_another_tokenizer_is_refused(target_dir, plain, tmp_path):
    target_copy = str(tmp_path / "target")
    shutil.copytree(target_dir, target_copy)
    draft_dir = small_random(str(tmp_path / "draft"), vocab_size=plain.vocab_size)
    _word_level(os.path.join(target_copy, "tokenizer.json"), {"a": 0, "b": 1})
    _word_level(os.path.join(draft_dir, "tokenizer.json"), {"a": 1, "b": 0})
    with pytest.raises(CheckpointError, match=r"maps tokens to ids unlike the target's .* 4 "
                                              r"\(token, id\) pairs differ"):
        Engine.from_pretrained(target_copy, draft_dir, config=SPEC_CONFIG)


def test_unknown_drafter_architecture_is_refused(target_dir, plain, tmp_path):
    draft_dir = small_random(str(tmp_path / "draft"), vocab_size=plain.vocab_size)
    path = os.path.join(draft_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(architectures=["LlamaForCausalLM"], model_type="llama")
    with open(path, "w") as f:
        json.dump(config, f)
    with pytest.raises(CheckpointError, match=r"unsupported drafter architecture: "
                                              r"architectures=\['LlamaForCausalLM'\].* or a "
                                              r"Qwen3 draft LM \(Qwen3ForCausalLM\)"):
        Engine.from_pretrained(target_dir, draft_dir, config=SPEC_CONFIG)


def test_drafter_kind_reads_config_json(target_dir, plain, tmp_path):
    from lightspec_jax.checkpoint import DRAFT_LM, convert_qwen3, drafter_kind

    draft_dir = small_random(str(tmp_path / "draft"), vocab_size=plain.vocab_size)
    assert drafter_kind(draft_dir) == DRAFT_LM
    convert_qwen3(draft_dir, str(tmp_path / "converted"), dtype="float32")
    assert drafter_kind(str(tmp_path / "converted")) == DRAFT_LM  # a converted draft LM too
    with pytest.raises(CheckpointError, match="is not a directory"):
        drafter_kind(str(tmp_path / "missing"))
