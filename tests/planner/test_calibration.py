"""Whole-step calibration (planner/calibration.py): drafting steps priced by how far the loop's
measured periods sit from the model's, against floor steps."""

import math

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, PlannerSpec, make_planner
from lightspec_jax.planner.calibration import StepCalibration
from test_host_costs import _outcome  # the step as the device runs it


def _feed(cal, depth, ratio, n, start=0, bucket=8):
    for i in range(n):
        cal.observe(bucket=bucket, depth=depth, predicted_ms=10.0, measured_ms=10.0 * ratio,
                    step=start + i)


def test_cells_shrink_toward_their_regime_and_regimes_toward_the_common_bias():
    cal = StepCalibration(cell_prior=4.0)
    assert cal.scale(8, 2, 0) == 1.0
    _feed(cal, 2, 1.3, 4)
    assert cal.scale(8, 2, 4) == pytest.approx(1.3, rel=1e-2)
    assert cal.scale(4, 0, 4) == pytest.approx(1.3, rel=1e-2)  # the floor: the common bias
    _feed(cal, 0, 1.0, 4, start=4, bucket=4)
    # common = 1/2 log 1.3; drafting regime 3/4, its cell 7/8; floor regime 1/4, its cell 1/8
    assert cal.scale(8, 2, 8) == pytest.approx(1.3 ** 0.875, rel=1e-2)
    assert cal.scale(16, 3, 8) == pytest.approx(1.3 ** 0.75, rel=1e-2)
    assert cal.scale(4, 0, 8) == pytest.approx(1.3 ** 0.125, rel=1e-2)


def test_scales_are_bounded_and_fade():
    cal = StepCalibration(half_life=100.0)
    _feed(cal, 1, 9.0, 100)
    assert cal.scale(8, 1, 100) == pytest.approx(1.5)
    cal = StepCalibration(half_life=100.0)
    _feed(cal, 1, 1.3, 100)
    assert 1.0 < cal.scale(8, 1, 100 + 400) < 1.03


def test_bad_samples_are_ignored():
    cal = StepCalibration()
    for bad in (math.nan, 0.0, -1.0, math.inf):
        cal.observe(bucket=8, depth=1, predicted_ms=bad, measured_ms=5.0, step=0)
        cal.observe(bucket=8, depth=0, predicted_ms=5.0, measured_ms=bad, step=0)
    assert cal.scale(8, 1, 1) == 1.0 and cal.scale(8, 0, 1) == 1.0 and cal.version == 0


def _serve(drafting_ratio, **kwargs) -> list[int]:
    """The depths the planner chose (_serve_plans)."""
    return [plan.draft_depth for plan in _serve_plans(drafting_ratio, **kwargs)]


def _serve_plans(drafting_ratio, *, calibrate: bool = True, rate: float = 0.8,
                 explore: float = 0.0, steps: int = 80, **options) -> list:
    """Drafting pays a little by the model (a row costs 1 ms, a draft is 80% accepted: about
    15% fewer ms per token than the floor); the loop reports periods: floor steps as
    predicted, steps after a draft `drafting_ratio` (a number, or a function of the depth)
    times their prediction. Returns the plans (options: the planner's)."""
    buckets = tuple(range(1, 33))
    s = PlannerSpec(verify_buckets=buckets, draft_depths=(1, 2, 3), max_depth=3, floor=True)
    p = make_planner("dynamic", s, target_costs=CostTable({b: 4.0 + 1.0 * b for b in buckets}),
                     draft_costs=CostTable({b: 0.05 for b in buckets}),
                     depth_costs=CostTable({1: 0.2, 2: 0.4, 3: 0.6}), overlap=False,
                     explore_fraction=explore, calibrate=calibrate, replan_every=1,
                     # the prior curve is the true one; the drafts' calibration, which
                     # one noisy step of 4 requests can tip in the near-tie of depths 2 and 3
                     # here, is tested apart (test_small_samples.py)
                     survival_prior_accept=rate, calibrate_tokens=False, **options)
    rng = np.random.default_rng(0)
    p.plan(num_requests=4)
    plans = []
    for _ in range(steps):
        plan = p.plan(num_requests=4)
        plans.append(plan)
        p.observe(_outcome(plan, rng, rate))
        d = plan.verified_depth
        ratio = 1.0 if d == 0 else drafting_ratio(d) if callable(drafting_ratio) else drafting_ratio
        p.observe_period(plan=plan, period_ms=plan.predicted_ms * ratio)
    return plans


def test_drafting_that_runs_over_its_price_loses_to_the_floor():
    """Drafting 40% over its price, the floor as priced: the planner visits the floor (a close
    rival), measures both, and settles there."""
    assert _serve(1.0, explore=0.02, steps=200)[-1] > 0  # as modelled: drafting pays
    assert _serve(1.4, explore=0.02, steps=400)[-20:].count(0) >= 15
    assert _serve(1.4, calibrate=False, explore=0.02, steps=200)[-1] > 0  # the model wins


def test_deep_steps_that_run_over_their_price_give_way_to_shallow_ones():
    """With 95% acceptance the model prefers the deepest draft; if the loop says depth-3
    steps cost 30% over their prediction and shallower ones as predicted, it drafts less."""
    assert _serve(1.0, rate=0.95, explore=0.02, steps=200)[-1] == 3
    deep = _serve(lambda d: 1.3 if d == 3 else 1.0, rate=0.95, explore=0.02, steps=200)
    assert deep[-20:].count(3) <= 5


def test_a_close_rival_gets_visited_and_wins_when_it_measures_cheaper():
    """The model prefers depth 3 with depth 2 close behind; the loop says depth-2 steps run at
    70% of their price. Sitting at depth 3 alone would never show it: the planner visits the
    rival now and then (with exploration on), measures it, and moves there."""
    cheap2 = lambda d: 0.7 if d == 2 else 1.0  # noqa: E731
    assert _serve(1.0, rate=0.95, explore=0.02, steps=200)[-1] == 3
    assert _serve(cheap2, rate=0.95, explore=0.0, steps=200)[-1] == 3  # never visits
    depths = _serve(cheap2, rate=0.95, explore=0.02, steps=200)
    assert depths[-20:].count(2) >= 15


@pytest.mark.parametrize("visit", [1, 4])
def test_a_visit_to_the_floor_is_a_run_of_floor_steps(visit):
    """The floor is a close rival of drafting by the model; a visit to it lasts `floor_visit`
    steps: the first stops drafting, the others are floor steps (nothing verified, nothing
    drafted) priced as the floor, whose periods are what the floor's calibration learns from.
    Drafting 40% over its price, the visits show the floor cheaper, and the planner stays."""
    plans = _serve_plans(1.4, explore=0.02, steps=400, floor_visit=visit)
    depths = [plan.draft_depth for plan in plans]
    first = depths.index(0)
    assert depths[first:first + visit] == [0] * visit
    visits = [plan for plan in plans if plan.reason == "visit"]
    if visit == 1:
        assert not visits
    else:
        assert plans[first + 1:first + visit] == visits[:visit - 1]
        assert all(plan.at_floor and math.isfinite(plan.predicted_ms) for plan in visits)
        assert plans[first + visit].reason != "visit"  # the visit ends, a fresh decision
    assert depths[-20:].count(0) >= 15


def test_the_grid_is_scale_at_every_cell():
    """grid() prices a whole [depth, bucket] grid at once; each entry is that cell's scale()."""
    rng = np.random.default_rng(0)
    cal = StepCalibration()
    for step in range(60):
        cal.observe(bucket=int(rng.choice([4, 8, 16])), depth=int(rng.integers(0, 4)),
                    predicted_ms=10.0, measured_ms=float(rng.uniform(5, 20)), step=step)
    buckets, depths = [4, 8, 16, 32], [0, 1, 2, 3, 5]
    grid = cal.grid(buckets, depths, 80)
    assert grid.shape == (5, 4)
    singles = [[cal.scale(b, d, 80) for b in buckets] for d in depths]
    np.testing.assert_allclose(grid, singles, rtol=1e-12)
    assert len({round(v, 9) for v in grid.ravel()}) > 4  # cells differ: not one common value
