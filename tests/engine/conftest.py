import pytest

from lightspec_jax import Engine, EngineConfig

ENGINE_CONFIG = EngineConfig(max_num_seqs=6, max_model_len=96, dtype="float32",
                             max_num_batched_tokens=24, compilation_cache_dir=None,
                             show_progress=False)


@pytest.fixture(scope="session")
def engines(hf_checkpoints):
    """checkpoint name -> (engine, transformers model); engines are shared, tests leave them idle."""
    out = {}
    for name, (directory, hf_model) in hf_checkpoints.items():
        out[name] = (Engine.from_pretrained(directory, config=ENGINE_CONFIG), hf_model)
    return out


@pytest.fixture
def engine(engines):
    eng, hf_model = engines["untied_sharded"]
    yield eng
    assert not eng.has_unfinished_requests(), "a test left requests in the shared engine"
