"""The no-speculation floor: a step that drafts nothing keeps the drafter current, so
speculation resumes at full acceptance (the failure of TensorRT-LLM #16888, where a drafter
skipped for some steps proposes from a stale cache, cannot happen), and output stays lossless."""

import json

import numpy as np
import pytest

from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from lightspec_jax.checkpoint import load_qwen3
from lightspec_jax.drafters import DraftLMDrafter
from lightspec_jax.engine.runner import CATCH_UP_WINDOW
from lightspec_jax.planner import CostTable
from lightspec_jax.planner.base import BasePlanner

from conftest import BASE
from draft_lm_current import serve_checking_current

BUCKETS = (4, 8, 16)
DEPTH = 3


class ScriptedPlanner(BasePlanner):
    """Full width at the depth `script(call)` says: 0 is the floor."""

    def __init__(self, spec, script):
        super().__init__(spec, refresh_costs=False)
        self.script = script

    def _plan(self, *, n, m, d_prev, available, confidences):
        return self._make(n=n, m=m, d_prev=d_prev, fill=available,
                          depth=self.script(self.steps), reason="static")


@pytest.fixture(scope="module")
def copy_engine(target_dir, tmp_path_factory):
    """Dynamic K=3 with an exact copy of the target as draft model: every draft is right."""
    path = tmp_path_factory.mktemp("costs") / "costs.json"
    path.write_text(json.dumps({"target": CostTable({b: 1.0 + b for b in BUCKETS}).to_json(),
                                "draft": CostTable({b: 0.1 for b in BUCKETS}).to_json()}))
    config = EngineConfig(max_num_seqs=4, verify_buckets=BUCKETS,
                          speculative=SpeculativeConfig(policy="dynamic",
                                                        num_speculative_tokens=DEPTH),
                          cost_table_path=str(path), refresh_costs=False, **BASE)
    engine = Engine(load_qwen3(target_dir), config=config,
                    drafter=DraftLMDrafter(load_qwen3(target_dir)))
    assert engine.planner.spec.floor  # the dynamic planner is offered depth 0
    return engine


def run(engine, script, prompts, max_tokens):
    engine.planner = ScriptedPlanner(engine.planner.spec, script)
    start = len(engine.stats.steps)
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return outs, list(engine.stats.steps)[start:]


@pytest.mark.parametrize("floor_steps", [1, 6])
def test_speculation_resumes_at_full_acceptance_after_the_floor(copy_engine, plain_engine,
                                                                floor_steps):
    prompts = [[3, 8, 13], [50, 60], [7] * 5, [99, 1, 98]]
    first = 4  # steps drafting DEPTH, then `floor_steps` drafting nothing, then DEPTH again
    script = lambda call: 0 if first < call <= first + floor_steps else DEPTH  # noqa: E731
    outs, steps = run(copy_engine, script, prompts, max_tokens=40)
    ref = plain_engine.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]  # lossless throughout

    decode = [s for s in steps if s.num_requests == 4]
    shape = [(s.index, s.used_rows, s.draft_depth) for s in decode]
    # The floor ran: steps that drafted nothing, and so verified one row per request next.
    assert sum(s.draft_depth == 0 for s in decode) == floor_steps, shape
    bare = [s for prev, s in zip(decode, decode[1:]) if prev.draft_depth == 0]
    assert len(bare) == floor_steps and all(s.used_rows == s.num_requests for s in bare), shape
    after = [s for s in decode if s.index > bare[-1].index and s.used_rows > s.num_requests]
    assert after, shape
    # A current drafter that copies the target proposes the target's own tokens: every draft
    # verified after the floor is accepted, as before it.
    for s in after[:3]:
        assert s.accepted == s.used_rows - s.num_requests, (s, shape)



def test_eagle3_floor_runs_stay_lossless(spec_engines, plain_engine):
    """The Eagle3 floor path (the drafter writes its cache alone, models/eagle3.write_cache,
    whose writes equal the forward's: tests/models/test_eagle3.py) inside the fused step:
    floor runs of random lengths between drafting steps of random depths, lossless."""
    engine = spec_engines("eagle3_k5")
    rng = np.random.default_rng(5)
    depths = rng.choice([0, 0, 0, 1, 3, 5], size=200)
    prompts = [[int(t) for t in rng.integers(2, 200, size=n)] for n in (3, 9, 5, 14, 2)]
    saved = engine.planner
    try:
        outs, steps = run(engine, lambda call: int(depths[call % len(depths)]), prompts,
                          max_tokens=30)
    finally:
        engine.planner = saved
    ref = plain_engine.generate(prompts, SamplingParams(max_tokens=30, ignore_eos=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    drafted = [s.draft_depth for s in steps if s.num_requests]
    assert drafted.count(0) > 5 and max(drafted) > 0, drafted


def test_draft_lm_floor_records_and_catches_up_before_it_commits(copy_engine, plain_engine):
    """The draft LM's floor steps only record their rows (a plain step's cost); the next step
    that commits first catches the draft model up, so every time it drafts its K/V at each
    committed position equal a forward over the committed tokens from scratch - after a floor
    run within one catch-up window and one longer than a window (runner.CATCH_UP_WINDOW)."""
    engine, runner = copy_engine, copy_engine.runner
    assert runner.floor_buckets and runner.catch_up_registry.sizes[-1] == CATCH_UP_WINDOW
    long_run = CATCH_UP_WINDOW + 5
    floors = set(range(3, 3 + long_run)) | {long_run + 7, long_run + 8, long_run + 9}
    engine.planner = ScriptedPlanner(engine.planner.spec,
                                     lambda call: 0 if call in floors else DEPTH)
    prompts = {"a": [3, 8, 13], "b": [50, 60], "c": [7] * 5, "d": [99, 1, 98]}
    params = SamplingParams(max_tokens=70, ignore_eos=True)
    ref = {k: o.token_ids for k, o in zip(prompts, plain_engine.generate(list(prompts.values()),
                                                                         params))}
    behind = []  # what each catch-up made up for (positions per slot, an upper bound)
    catch_up = runner._catch_up

    def counted():
        behind.append(runner.behind)
        catch_up()

    runner._catch_up = counted
    try:
        outs, _, checked = serve_checking_current(engine, prompts, ref, params)
    finally:
        del runner._catch_up
    assert outs == ref  # lossless throughout
    assert checked > 20
    caught = [b for b in behind if b]
    # The long floor run (its first step verifies the last proposal and commits) and the
    # short one, each one position per slot and step.
    assert caught == [long_run - 1, 2], behind
