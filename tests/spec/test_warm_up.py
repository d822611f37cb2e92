"""The start-up warm-up runs every compiled step once on an empty batch (an executable's first
run costs several steps' time) and leaves no trace: slots, caches and outputs as before."""

import numpy as np
import pytest

from lightspec_jax import SamplingParams

PROMPTS = [[5, 9, 2, 7], [3, 3, 8], [11, 4, 6, 1, 9, 2]]


def _serve(engine):
    params = [SamplingParams(max_tokens=12, seed=i) for i in range(len(PROMPTS))]
    return [o.token_ids for o in engine.generate(PROMPTS, params)]


@pytest.mark.parametrize("name", ["copy_k3", "dynamic_k4"])
def test_warming_an_idle_engine_again_changes_no_output(spec_engines, plain_engine, name):
    engine = spec_engines(name)
    before = _serve(engine)  # (the suite's engines compile their steps on first use)
    runs = {engine.runner.draft_registry.name: engine.runner.draft_registry.compiled,
            engine.runner.decode_registry.name: engine.runner.decode_registry.compiled}
    assert all(runs.values())  # there are draft and decode executables to warm
    engine.runner.warm_up()
    assert not np.asarray(engine.runner.state.active).any()
    assert _serve(engine) == before == _serve(plain_engine)  # lossless still


def test_a_busy_engine_is_not_warmed(spec_engines):
    engine = spec_engines("copy_k3")
    engine.add_request("busy", [5, 9, 2], SamplingParams(max_tokens=40))
    engine.step()
    engine.step()
    with pytest.raises(RuntimeError, match="requests"):
        engine.runner.warm_up()
    while engine.has_unfinished_requests():
        engine.step()
