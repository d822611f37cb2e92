"""Online cost refresh inside the engine: a step's device time is taken only when the host can
tell it from its own timestamps, and refreshed cells stay in the sweep's range."""

import time

import numpy as np
import pytest

from lightspec_jax import SamplingParams
from lightspec_jax.engine.costs import device_interval_ms


def interval(**kw):
    args = dict(previous_ready=1.0, previous_waited=True, busy_at_enqueue=True, waited=True,
                ready=1.004)
    return device_interval_ms(**{**args, **kw})


def test_device_interval_needs_a_device_busy_from_read_to_read():
    # Both reads waited and the previous step was still running at enqueue: the device
    # worked without a gap from the previous step's end to this one's.
    assert interval() == np.float64(1e3 * (1.004 - 1.0))
    # The host found the results ready: the device idled for an unknown time (host-bound).
    assert interval(waited=False) is None
    assert interval(previous_waited=False) is None
    # The device finished the previous step before this one was enqueued: a gap.
    assert interval(busy_at_enqueue=False) is None
    # There is no earlier read.
    assert interval(previous_ready=None) is None


def test_refreshed_cells_stay_near_the_sweep(spec_engines):
    """The earlier refresh timed host loop intervals and subtracted an estimated draft time,
    clamping at 1e-3 ms: cells fell to ~0 and the planner verified everything. A refreshed cell
    is now a share of a measured device interval, so it stays the size of the swept cost:
    within an order of magnitude of it (a loaded CPU moves a tiny model's times several-fold
    between the sweep and serving; the old failure was three orders)."""
    engine = spec_engines("dynamic_k4")
    planner = engine.planner
    # The draft table (drafting's part that follows B) is nil by construction - the verify
    # step writes the drafter's cache at every depth - so its swept cells are a placeholder
    # with no size to keep, except at the floor buckets of a drafter that catches up (this
    # draft LM): there a floor step only records, and the table holds the commit forward.
    floor = engine.runner.floor_buckets
    draft = _reference_column(planner.draft_costs.to_json())
    assert floor and max(ms for rows, ms in draft.items() if int(rows) not in floor) <= 1e-3
    sweep = {k: _reference_column(t.to_json()) for k, t in
             (("target", planner.target_costs), ("depth", planner.depth_costs))}
    sweep["draft"] = {rows: ms for rows, ms in draft.items() if int(rows) in floor}
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 250, size=6).tolist() for _ in range(8)]
    engine.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
    for name, reference in sweep.items():
        table = getattr(planner, f"{name}_costs").to_json()
        for column in table["columns"]:
            for rows, ms in column["rows"].items():
                if rows in reference:
                    assert ms > 0.1 * reference[rows], (name, column["context_len"], rows, ms)


def _reference_column(table: dict) -> dict:
    return next(c["rows"] for c in table["columns"]
                if c["context_len"] == table["reference_context"])


def test_host_samples_come_from_decode_work_alone(target_dir, monkeypatch):
    """The planner prices a step's host time from the loop's samples. A step() that compiled a
    sampled variant on its first use spent hundreds of ms on that: one such sample priced a
    regime several-fold off (the planner then sat at the floor, or never took it, and never
    went back to correct the price). No such step may feed the host tables. A step that
    dispatched a prompt chunk does, less the host time of that dispatch: here each chunk's
    dispatch takes 300 ms, and no sample may hold it. A fresh engine, so that sampled
    requests compile their variants lazily here."""
    from conftest import BASE, make_drafter

    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
    from lightspec_jax.checkpoint import load_qwen3
    from lightspec_jax.engine import buckets

    config = EngineConfig(max_num_seqs=2, verify_buckets=(2, 4),
                          speculative=SpeculativeConfig(policy="static",
                                                        num_speculative_tokens=1), **BASE)
    engine = Engine(load_qwen3(target_dir), config=config,
                    drafter=make_drafter("copy", target_dir, 0.2), eos_token_ids=(1,))
    runner, planner = engine.runner, engine.planner
    seen = {"compiled": False, "prompt": False, "steps": 0, "samples": 0, "with_prompt": 0}
    for name in ("prefill", "decode"):
        real = getattr(runner, name)

        def watch(*args, _real=real, _name=name, **kw):
            compiles = buckets.lazy_compile_events()
            if _name == "prefill":
                time.sleep(0.3)  # a slow dispatch of prompt work
                seen["prompt"] = True
            out = _real(*args, **kw)
            seen["compiled"] |= buckets.lazy_compile_events() != compiles
            return out
        monkeypatch.setattr(runner, name, watch)
    step, observe_host = engine.step, planner.observe_host

    def counted_step():
        seen["compiled"] = seen["prompt"] = False
        out = step()
        seen["steps"] += seen["compiled"]
        return out

    def checked_observe_host(**kw):
        assert not seen["compiled"], "a compile step fed the host cost tables"
        assert kw["host_ms"] < 200.0, "a prompt chunk's dispatch reached the host cost tables"
        seen["samples"] += 1
        seen["with_prompt"] += seen["prompt"]
        return observe_host(**kw)
    monkeypatch.setattr(engine, "step", counted_step)
    monkeypatch.setattr(planner, "observe_host", checked_observe_host)
    before = buckets.lazy_compile_events()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(2, 250, size=6).tolist() for _ in range(4)]
    # The last request decodes alone for a while: its one-request bucket compiles on first
    # use in a step with no prefill.
    lengths = (10, 40, 12, 8)
    engine.generate(prompts, [SamplingParams(max_tokens=n, temperature=0.8, seed=i,
                                             ignore_eos=True) for i, n in enumerate(lengths)])
    # Not vacuous: variants compiled on first use, prompt chunks were dispatched beside
    # decode steps that fed the tables, and other clean steps fed them too.
    assert buckets.lazy_compile_events() > before
    assert seen["steps"] >= 2 and seen["samples"] >= 10 and seen["with_prompt"] >= 1
    host = planner.host_draft_costs
    assert not host.is_empty and host.estimate(2) < 200.0


@pytest.mark.parametrize("leave_every", [None, 6])
def test_floor_steps_feed_the_planner_one_in_floor_timed(spec_engines, monkeypatch,
                                                         leave_every):
    """A floor step (nothing verified, nothing drafted) teaches the planner only what steps
    cost, so past the first FLOOR_TIMED floor steps of a run one in FLOOR_TIMED is a timing
    sample (device interval, period) and the others skip the planner's bookkeeping, a share
    of a cheap step's host time. A step that leaves the floor (`leave_every`: the planner
    drafts on every sixth decision) is never a sample: it runs work its plan does not
    price."""
    import dataclasses
    import math

    from lightspec_jax.engine.planning import FLOOR_TIMED

    assert FLOOR_TIMED > 1
    engine = spec_engines("ngram_k4")
    planner = engine.planner
    decide = planner._next_depth

    calls = iter(range(10**6))

    def floor_only(costs, n):
        decide(costs, n)  # stage 2 still prices its grid, which the rest of plan() reads
        leave = leave_every is not None and next(calls) % leave_every == leave_every - 1
        return (1 if leave else 0), 1.0
    monkeypatch.setattr(planner, "_next_depth", floor_only)
    monkeypatch.setattr(planner, "options",
                        dataclasses.replace(planner.options, explore_fraction=0.0,
                                            replan_every=1, replan_limit=None))
    seen = {"floor": 0, "intervals": 0, "periods": 0, "runs": 0, "left": 0, "exit_samples": 0}
    observe, observe_period = planner.observe, planner.observe_period

    def leaves(plan):
        return plan.verified_depth == 0 and plan.draft_depth > 0

    def counted_observe(obs):
        seen["intervals"] += obs.plan.at_floor and obs.step_ms is not None
        seen["exit_samples"] += leaves(obs.plan) and obs.step_ms is not None
        return observe(obs)

    def counted_period(*, plan, period_ms):
        seen["periods"] += plan.at_floor
        seen["exit_samples"] += leaves(plan)
        return observe_period(plan=plan, period_ms=period_ms)
    monkeypatch.setattr(planner, "observe", counted_observe)
    monkeypatch.setattr(planner, "observe_period", counted_period)
    last = {"floor": False}

    def observer(e):
        if not e.record.num_requests:
            return
        floor = e.plan.at_floor
        seen["floor"] += floor
        seen["runs"] += floor and not last["floor"]
        seen["left"] += leaves(e.plan)
        last["floor"] = floor
    engine.add_step_observer(observer)
    try:
        rng = np.random.default_rng(2)
        prompts = [rng.integers(2, 250, size=6).tolist() for _ in range(6)]
        engine.generate(prompts, SamplingParams(max_tokens=30, ignore_eos=True))
    finally:
        engine.remove_step_observer(observer)
    # not vacuous: runs at the floor, timed now and then
    assert seen["floor"] >= (25 if leave_every is None else 15), seen
    bound = seen["runs"] * FLOOR_TIMED + math.ceil(seen["floor"] / FLOOR_TIMED)
    assert 1 <= seen["periods"] <= bound and seen["intervals"] <= bound
    if leave_every is None:  # one run: all but one floor step in FLOOR_TIMED past its start
        assert seen["runs"] == 1 and seen["periods"] < seen["floor"] - 10
    else:
        assert seen["left"] >= 3  # not vacuous: it left the floor, and came back
        assert seen["periods"] >= seen["runs"]  # a run's first steps are samples
    assert seen["exit_samples"] == 0
