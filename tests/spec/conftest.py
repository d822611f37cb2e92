"""Speculative engines shared by the lossless tests (compiled once per session)."""

import dataclasses

import pytest

from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
from lightspec_jax.checkpoint import load_qwen3
from flax import nnx

from lightspec_jax.drafters import DraftLMDrafter, Eagle3Drafter
from lightspec_jax.models import Eagle3, Eagle3Config, Qwen3, Qwen3Config

# Engines compile each step on first use: a test touches some of an engine's buckets only,
# and with this the suite's workers compiled 677 programs instead of 784, 564 s instead of
# 645 (BENCHMARKS.md, "Thirty-third session"). Compiling at start-up, the default, stays
# covered by tests/engine/test_no_recompile.py and the multi-device check. Prompt chunks pad
# to one 32-row bucket: each engine and sampling mode compiles one prefill program, not one
# per row count its chunks happen to reach (8, 12, 16, 24, 32); chunking itself follows
# max_num_batched_tokens, and the row buckets are tests/engine's and the benchmarks' to vary.
BASE = dict(dtype="float32", max_model_len=80, max_num_batched_tokens=32, row_buckets=(32,),
            compilation_cache_dir=None, show_progress=False, compile_on_first_use=True)

# name -> (slots N, depth K, verify buckets, drafter kind, corrupt rate[, policy]); every engine overlaps
# dispatch and reads except those in NO_OVERLAP (both paths must be lossless).
SPEC_ENGINES = {
    # A copy of the target as draft model, corrupted: long spans, full acceptance, rejections.
    "copy_k3": (8, 3, (4, 8, 16, 32), "copy", 0.25),
    "copy_k11": (4, 11, (4, 12, 24, 48), "copy", 0.1),
    "copy_k5_c32": (32, 5, (32, 64, 128, 192), "copy", 0.3),
    # The (sharp) target's copy sampling its drafts with its own keys: often right at T = 1.
    "sampling_k3": (8, 3, (4, 8, 16, 32), "copy_sampling", 0.0),
    # A random Eagle3 (the real drafter architecture, target features): rarely right.
    "eagle3_k5": (6, 5, (6, 12, 24, 36), "eagle3", 0.0),
    # An unrelated random draft model: almost always wrong.
    "random_k1": (4, 1, (4, 8), "random", 0.0),
    # The planner's policies, with the corrupted copy drafter.
    "dynamic_k4": (4, 4, (4, 6, 8, 12, 16, 20), "copy", 0.2, "dynamic"),
    "dspark_k3": (4, 3, (4, 8, 12, 16), "copy", 0.2, "dspark"),
    # Prompt lookup (no model; SpeculativeConfig(method="ngram"), n-grams of 1-3 tokens): the
    # tiny targets repeat themselves, so matches come often.
    "ngram_k4": (6, 4, (6, 12, 18, 24, 30), "ngram", 0.0, "dynamic"),
    # Waiting requests admitted at most every third step while others decode.
    "dynamic_k4_admit3": (4, 4, (4, 6, 8, 12, 16, 20), "copy", 0.2, "dynamic"),
}
ADMISSION_INTERVAL = {"dynamic_k4_admit3": 3}  # EngineConfig.admission_interval (default 1)


NO_OVERLAP = {"eagle3_k5"}  # its proposal test compares device state after each step

# The significance level of the distribution tests (test_probabilistic*.py).
SIGNIFICANCE = 1e-3


@pytest.fixture(scope="session")
def target_dir(hf_checkpoints):
    return hf_checkpoints["untied_sharded"][0]


@pytest.fixture(scope="session")
def plain_engine(target_dir):
    return Engine.from_pretrained(target_dir, config=EngineConfig(max_num_seqs=8, **BASE))


@pytest.fixture(scope="session")
def sharp_plain_engine(sharp_checkpoint):
    return Engine.from_pretrained(sharp_checkpoint[0], config=EngineConfig(max_num_seqs=8, **BASE))


def random_eagle3(target_cfg, *, draft_vocab=128, seed=4):
    """A random Eagle3 with a reduced draft vocabulary (non-trivial d2t) and a sharp lm_head,
    so its argmax has clear winners (float noise between batch shapes cannot flip it)."""
    import jax.numpy as jnp
    import numpy as np
    cfg = Eagle3Config.for_target(target_cfg, draft_vocab_size=draft_vocab, rope_theta=10000.0)
    model = Eagle3(cfg, rngs=nnx.Rngs(seed))
    hot = np.sort(np.random.default_rng(seed).choice(target_cfg.vocab_size, draft_vocab,
                                                     replace=False))
    model.d2t.set_value(jnp.asarray(hot - np.arange(draft_vocab), jnp.int32))
    model.lm_head.set_value(model.lm_head[...] * 30.0)
    return model


def make_drafter(kind, target_dir, corrupt_rate):
    if kind == "copy":
        return DraftLMDrafter(load_qwen3(target_dir), corrupt_rate=corrupt_rate, seed=7)
    if kind == "copy_sampling":
        return DraftLMDrafter(load_qwen3(target_dir), temperature=1.0, seed=7)
    target_cfg = load_qwen3(target_dir).config
    if kind == "eagle3":
        return Eagle3Drafter(random_eagle3(target_cfg))
    small = Qwen3Config(vocab_size=target_cfg.vocab_size, hidden_size=32, intermediate_size=64,
                        num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16)
    return DraftLMDrafter(Qwen3(small, rngs=nnx.Rngs(3)))


@pytest.fixture(scope="session")
def spec_engines(target_dir, sharp_checkpoint):
    cache = {}

    def get(name):
        if name not in cache:
            slots, depth, buckets, kind, rate, *policy = SPEC_ENGINES[name]
            target_dir_ = sharp_checkpoint[0] if kind == "copy_sampling" else target_dir
            config = EngineConfig(max_num_seqs=slots, verify_buckets=buckets,
                                  overlap=name not in NO_OVERLAP,
                                  admission_interval=ADMISSION_INTERVAL.get(name, 1),
                                  speculative=SpeculativeConfig(
                                      policy=policy[0] if policy else "static",
                                      num_speculative_tokens=depth),
                                  **BASE)
            if kind == "ngram":  # the engine makes its own drafter from the method
                config = dataclasses.replace(config, speculative=dataclasses.replace(
                    config.speculative, method="ngram"))
            cache[name] = Engine(load_qwen3(target_dir_), config=config,
                                 drafter=None if kind == "ngram" else
                                 make_drafter(kind, target_dir_, rate),
                                 eos_token_ids=(1,))
        return cache[name]
    return get


def fixed_costs(directory, buckets) -> str:
    """A cost-table file with fixed costs, so planner decisions do not hang on a noisy CPU: a
    verify grows with its rows, a draft costs little."""
    import json

    from lightspec_jax.planner import CostTable
    path = directory / "costs.json"
    path.write_text(json.dumps({"target": CostTable({b: 1.0 + 0.1 * b for b in buckets}).to_json(),
                                "draft": CostTable({b: 0.05 for b in buckets}).to_json()}))
    return str(path)
