"""Whole-step calibration (planner/calibration.py): drafting steps priced by how far the loop's
measured periods sit from the model's, against floor steps."""

import math

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, PlannerSpec, StepObservation, make_planner
from lightspec_jax.planner.fill import fill_lengths
from lightspec_jax.planner.calibration import RegimeCalibration


def _feed(cal, drafting, ratio, n, start=0):
    for i in range(n):
        cal.observe(drafting=drafting, predicted_ms=10.0, measured_ms=10.0 * ratio, step=start + i)


def test_no_correction_until_both_regimes_are_measured():
    cal = RegimeCalibration(min_samples=4)
    _feed(cal, True, 1.3, 10)
    _feed(cal, False, 0.9, 3)
    assert cal.drafting_scale(20) == 1.0
    _feed(cal, False, 0.9, 1, start=13)
    assert cal.drafting_scale(14) == pytest.approx(1.3 / 0.9, rel=1e-2)


def test_a_common_bias_moves_nothing_and_the_scale_is_bounded():
    cal = RegimeCalibration()
    _feed(cal, True, 1.4, 8)
    _feed(cal, False, 1.4, 8)
    assert cal.drafting_scale(8) == pytest.approx(1.0)
    _feed(cal, True, 9.0, 50, start=8)
    assert cal.drafting_scale(58) == pytest.approx(1.5)


def test_old_evidence_fades():
    cal = RegimeCalibration(half_life=100.0)
    _feed(cal, True, 1.3, 8)
    _feed(cal, False, 1.0, 8)
    fresh, old = cal.drafting_scale(8), cal.drafting_scale(8 + 300)
    assert fresh == pytest.approx(1.3, rel=1e-2) and 1.0 < old < 1.05


def test_bad_samples_are_ignored():
    cal = RegimeCalibration(min_samples=1)
    for bad in (math.nan, 0.0, -1.0, math.inf):
        cal.observe(drafting=True, predicted_ms=bad, measured_ms=5.0, step=0)
        cal.observe(drafting=False, predicted_ms=5.0, measured_ms=bad, step=0)
    assert cal.drafting_scale(1) == 1.0


def _serve(drafting_ratio: float, *, calibrate: bool = True) -> list[int]:
    """Drafting pays a little by the model (a row costs 1 ms, a draft 80% accepted: about 15% fewer ms per token); the loop
    reports periods: floor steps as predicted, drafting steps `drafting_ratio` times their
    prediction. Returns the depths the planner chose."""
    buckets = tuple(range(1, 33))
    s = PlannerSpec(verify_buckets=buckets, draft_depths=(1, 2, 3), max_depth=3, floor=True)
    p = make_planner("dynamic", s, target_costs=CostTable({b: 4.0 + 1.0 * b for b in buckets}),
                     draft_costs=CostTable({b: 0.05 for b in buckets}),
                     depth_costs=CostTable({1: 0.2, 2: 0.4, 3: 0.6}), overlap=False,
                     explore_fraction=0.0, calibrate=calibrate, replan_every=1)
    rng = np.random.default_rng(0)
    p.plan(num_requests=4)
    depths = []
    for _ in range(80):
        plan = p.plan(num_requests=4)
        depths.append(plan.draft_depth)
        p.observe(_outcome(plan, rng, 0.8))
        ratio = drafting_ratio if plan.draft_depth > 0 else 1.0
        p.observe_period(plan=plan, period_ms=plan.predicted_ms * ratio)
        if len(depths) % 10 == 0:  # now and then a floor step, as admissions give
            p.observe_period(plan=_floor_plan(p), period_ms=_floor_plan(p).predicted_ms)
    return depths


def _floor_plan(p):
    from lightspec_jax.planner import StepPlan
    return StepPlan(num_requests=4, num_with_proposal=4, verified_depth=0, fill_rows=4,
                    verify_rows=4, draft_depth=0, update_stats=False, reason="plan",
                    predicted_ms=8.0)


def test_drafting_that_runs_over_its_price_loses_to_the_floor():
    assert _serve(1.0)[-1] > 0  # as modelled: drafting pays
    assert _serve(1.4)[-1] == 0  # the loop says drafting steps cost 40% more: the floor
    assert _serve(1.4, calibrate=False)[-1] > 0  # without calibration the model wins


def _outcome(plan, rng, rate: float) -> StepObservation:
    """The step as the device runs it: the fill spreads the plan's draft rows over the
    requests (equal confidences), each draft accepted with `rate` until the first miss."""
    n = plan.num_requests
    verified = fill_lengths(np.full((n, max(plan.verified_depth, 1)), 0.5),
                            np.full(n, plan.verified_depth), plan.fill_rows - n)  # [N]
    survive = np.cumprod(rng.random((n, max(plan.verified_depth, 1))) < rate, axis=1).sum(axis=1)
    return StepObservation(plan=plan, accept_lens=1 + np.minimum(survive, verified),
                           verify_lens=1 + verified)
