"""Speculative engines shared by the lossless tests (compiled once per session)."""

import pytest

from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
from lightspec_jax.checkpoint import load_qwen3
from lightspec_jax.drafters import DraftLMDrafter
from lightspec_jax.models import Qwen3, Qwen3Config
from flax import nnx

BASE = dict(dtype="float32", max_model_len=80, max_num_batched_tokens=32,
            compilation_cache_dir=None, show_progress=False)

# name -> (slots N, depth K, verify buckets, drafter kind, corrupt rate)
SPEC_ENGINES = {
    # A copy of the target as draft model, corrupted: long spans, full acceptance, rejections.
    "copy_k3": (8, 3, (4, 8, 16, 32), "copy", 0.25),
    "copy_k11": (4, 11, (4, 12, 24, 48), "copy", 0.1),
    "copy_k5_c32": (32, 5, (32, 64, 128, 192), "copy", 0.3),
    # An unrelated random draft model: almost always wrong.
    "random_k1": (4, 1, (4, 8), "random", 0.0),
}


@pytest.fixture(scope="session")
def target_dir(hf_checkpoints):
    return hf_checkpoints["untied_sharded"][0]


@pytest.fixture(scope="session")
def plain_engine(target_dir):
    return Engine.from_pretrained(target_dir, config=EngineConfig(max_num_seqs=8, **BASE))


def make_drafter(kind, target_dir, corrupt_rate):
    if kind == "copy":
        return DraftLMDrafter(load_qwen3(target_dir), corrupt_rate=corrupt_rate, seed=7)
    target_cfg = load_qwen3(target_dir).config
    small = Qwen3Config(vocab_size=target_cfg.vocab_size, hidden_size=32, intermediate_size=64,
                        num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16)
    return DraftLMDrafter(Qwen3(small, rngs=nnx.Rngs(3)))


@pytest.fixture(scope="session")
def spec_engines(target_dir):
    cache = {}

    def get(name):
        if name not in cache:
            slots, depth, buckets, kind, rate = SPEC_ENGINES[name]
            config = EngineConfig(max_num_seqs=slots, verify_buckets=buckets,
                                  speculative=SpeculativeConfig(policy="static",
                                                                num_speculative_tokens=depth),
                                  **BASE)
            cache[name] = Engine(load_qwen3(target_dir), config=config,
                                 drafter=make_drafter(kind, target_dir, rate),
                                 eos_token_ids=(1,))
        return cache[name]
    return get
