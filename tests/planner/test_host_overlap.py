"""How much host time the loop hides is learned from its periods (calibration.HostOverlap): a
step costs max(device, host) + exposed * min(device, host), and a fixed guess of `exposed`
that is wrong flattens or steepens the relative cost of depth."""

import math

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, PlannerSpec, make_planner
from lightspec_jax.planner.calibration import HostOverlap
from test_host_costs import _outcome  # the step as the device runs it

BUCKETS = tuple(range(1, 33))


@pytest.mark.parametrize("truth", [0.0, 0.3, 1.0])
def test_learns_the_exposed_share_from_periods(truth):
    rng = np.random.default_rng(0)
    for prior in (0.0, 1.0):
        model = HostOverlap(prior=prior)
        for _ in range(200):
            device, host = rng.uniform(2.0, 10.0), rng.uniform(0.5, 3.0)
            period = max(device, host) + truth * min(device, host)
            model.observe(num_requests=4, device_ms=device, host_ms=host,
                          period_ms=period * rng.uniform(0.98, 1.02))
        # +-2% jitter, clipped at 0 and 1, biases the ends inward a little
        assert model.exposed(4) == pytest.approx(truth, abs=0.08)


def test_samples_are_clipped_and_bad_ones_ignored():
    model = HostOverlap(prior=0.5)
    for bad in (math.nan, 0.0, -1.0, math.inf):
        model.observe(num_requests=4, device_ms=bad, host_ms=1.0, period_ms=5.0)
        model.observe(num_requests=4, device_ms=5.0, host_ms=1.0, period_ms=bad)
    model.observe(num_requests=0, device_ms=5.0, host_ms=1.0, period_ms=5.0)
    assert model.exposed(4) == 0.5  # nothing learned
    for _ in range(100):  # a stall-ridden loop: periods far over device + host
        model.observe(num_requests=4, device_ms=5.0, host_ms=1.0, period_ms=50.0)
    assert model.exposed(4) == pytest.approx(1.0, abs=0.1)
    for _ in range(100):  # periods under the device's own price
        model.observe(num_requests=4, device_ms=5.0, host_ms=1.0, period_ms=2.0)
    assert model.exposed(4) == pytest.approx(0.0, abs=0.1)


def test_an_unmeasured_batch_size_borrows_only_from_a_near_one():
    model = HostOverlap(prior=1.0)
    for _ in range(100):
        model.observe(num_requests=16, device_ms=10.0, host_ms=2.0, period_ms=10.0)
    assert model.exposed(16) < 0.1
    assert model.exposed(24) == model.exposed(16)  # within a factor 2: the nearest N
    assert model.exposed(64) == 1.0 and model.exposed(1) == 1.0  # far off: the prior


def _serve(*, prior_overlap: bool, hidden: bool = True, steps: int = 300) -> list[int]:
    """One request; each verify row costs 1 ms on the device, each draft depth 0.3 ms, host
    work 4 ms per step, `hidden` under the device in the loop (periods are the device time) or
    not (device + host). Drafts are accepted 75% of the time. Returns the depths chosen."""
    s = PlannerSpec(verify_buckets=BUCKETS, draft_depths=tuple(range(1, 8)), max_depth=7,
                    floor=True)
    target = {b: 2.0 + 1.0 * b for b in BUCKETS}
    stage = {d: 0.3 * d for d in range(1, 8)}
    p = make_planner("dynamic", s, target_costs=CostTable(target),
                     draft_costs=CostTable({b: 0.01 for b in BUCKETS}),
                     depth_costs=CostTable(stage), overlap=prior_overlap,
                     explore_fraction=0.0, calibrate=False, refresh_costs=True,
                     replan_every=1, survival_prior_accept=0.75)
    rng = np.random.default_rng(0)
    p.plan(num_requests=1)
    depths = []
    for _ in range(steps):
        plan = p.plan(num_requests=1)
        depths.append(plan.draft_depth)
        p.observe(_outcome(plan, rng, 0.75))
        p.observe_host(num_requests=1, host_ms=4.0, drafted=plan.draft_depth > 0)
        d = plan.verified_depth
        device = target[plan.verify_rows] + 0.01 + (stage[d] if d else 0.0)
        p.observe_period(plan=plan, period_ms=device + (0.0 if hidden else 4.0))
    return depths


def test_a_planner_that_assumed_host_time_adds_up_learns_that_it_hides():
    """Priced as device + 4 ms of host, depth looks cheap (the 4 ms is shared by every token
    of a deep step) and the planner drafts deeper than the device's own costs justify - as it
    should where the host time does add up. Where the loop's periods say it hides, the planner
    learns that and drafts as a planner that knew it from the start."""
    knew = _serve(prior_overlap=True)
    learned = _serve(prior_overlap=False)
    confirmed = _serve(prior_overlap=False, hidden=False)  # the host time really adds up

    def mean(depths):
        return float(np.mean(depths))

    assert mean(learned[-100:]) == pytest.approx(mean(knew[-100:]), abs=0.2)
    assert mean(confirmed[-100:]) > mean(learned[-100:]) + 1.0
