"""Host time is priced apart for steps that draft: one table for both regimes would price
drafting at the host time of whichever regime the planner happened to sit in."""

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, PlannerSpec, StepObservation, make_planner
from lightspec_jax.planner.fill import fill_lengths
from lightspec_jax.planner.objective import StepCosts

BUCKETS = tuple(range(1, 33))


def test_drafting_steps_pay_their_own_host_time():
    s = PlannerSpec(verify_buckets=(4, 8), draft_depths=(1, 2), max_depth=2, floor=True)
    target, draft = CostTable({4: 5.0, 8: 9.0}), CostTable({4: 0.5, 8: 0.5})
    for exposed, host, host_draft, floor_ms, spec_ms in (
            (1.0, 1.0, 3.0, 6.0, 9.0 + 0.5 + 0.5 + 3.0),
            (1.0, 1.0, None, 6.0, 9.0 + 0.5 + 0.5 + 1.0),  # nothing drafted yet: as the floor
            (0.0, 1.0, 30.0, 5.0, 30.0),
            (0.5, 1.0, 30.0, 5.5, 30.0 + 0.5 * 10.0)):  # half the smaller part shows
        costs = StepCosts.price(
            s, target, draft, num_requests=4, context_len=None, exposed=exposed,
            host_costs=CostTable({4: host}),
            host_draft_costs=None if host_draft is None else CostTable({4: host_draft}))
        grid = costs.step_ms_grid(np.array([4, 8]), np.array([0, 2]))
        assert grid[0, 0] == pytest.approx(floor_ms)
        assert grid[1, 1] == pytest.approx(spec_ms)


def _serve(host_floor_ms: float, host_draft_ms: float) -> int:
    """A planner for which drafting pays by device time alone (each draft row costs 0.2 ms and
    is accepted 90% of the time), fed host times of both regimes; returns its next depth."""
    s = PlannerSpec(verify_buckets=BUCKETS, draft_depths=(1, 2, 3), max_depth=3, floor=True)
    p = make_planner("dynamic", s, target_costs=CostTable({b: 4.0 + 0.2 * b for b in BUCKETS}),
                     draft_costs=CostTable({b: 0.05 for b in BUCKETS}),
                     depth_costs=CostTable({1: 0.2, 2: 0.4, 3: 0.6}), overlap=False,
                     explore_fraction=0.0)
    rng = np.random.default_rng(0)
    p.plan(num_requests=4)
    for i in range(40):
        plan = p.plan(num_requests=4)
        p.observe(_outcome(plan, rng, 0.9))
        p.observe_host(num_requests=4, host_ms=host_floor_ms, drafted=False)
        p.observe_host(num_requests=4, host_ms=host_draft_ms, drafted=True)
    return p.plan(num_requests=4).draft_depth


def test_the_floor_wins_when_drafting_steps_cost_host_time():
    assert _serve(host_floor_ms=0.5, host_draft_ms=0.5) > 0
    assert _serve(host_floor_ms=0.5, host_draft_ms=12.0) == 0


def _outcome(plan, rng, rate: float) -> StepObservation:
    """The step as the device runs it: the fill spreads the plan's draft rows over the
    requests (equal confidences), each draft accepted with `rate` until the first miss."""
    n = plan.num_requests
    verified = fill_lengths(np.full((n, max(plan.verified_depth, 1)), 0.5),
                            np.full(n, plan.verified_depth), plan.fill_rows - n)  # [N]
    survive = np.cumprod(rng.random((n, max(plan.verified_depth, 1))) < rate, axis=1).sum(axis=1)
    return StepObservation(plan=plan, accept_lens=1 + np.minimum(survive, verified),
                           verify_lens=1 + verified)


def test_one_host_stall_moves_a_price_at_most_twofold():
    """A step() that stalled (a compile, a preemption) must not price its regime far off: the
    planner would then never visit it again to correct the price. A sustained change still
    gets there, a factor of 2 per sample at most."""
    s = PlannerSpec(verify_buckets=(4, 8), draft_depths=(1, 2), max_depth=2, floor=True)
    p = make_planner("dynamic", s)
    p.observe_host(num_requests=4, host_ms=2.0)
    p.observe_host(num_requests=4, host_ms=900.0)  # a stall
    assert 2.0 < p.host_costs.estimate(4) <= 2.0 * 0.9 + 4.0 * 0.1 + 1e-9
    for _ in range(60):
        p.observe_host(num_requests=4, host_ms=40.0)  # a real change
    assert p.host_costs.estimate(4) == pytest.approx(40.0, rel=0.05)
    p.observe_host(num_requests=4, host_ms=0.01, drafted=True)  # tables apart; first replaces
    assert p.host_draft_costs.estimate(4) == pytest.approx(0.01)


def test_the_floor_never_pays_more_host_time_than_drafting():
    """A floor step does a drafting step's host work minus the draft dispatch: however its own
    (rarely refreshed) host cell was measured, it is priced at most at drafting's host time."""
    s = PlannerSpec(verify_buckets=(4, 8), draft_depths=(1, 2), max_depth=2, floor=True)
    target, draft = CostTable({4: 5.0, 8: 9.0}), CostTable({4: 0.5, 8: 0.5})
    for host, host_draft, floor_host in ((10.0, 2.5, 2.5), (1.0, 2.5, 1.0)):
        costs = StepCosts.price(s, target, draft, num_requests=4, context_len=None,
                                exposed=1.0, host_costs=CostTable({4: host}),
                                host_draft_costs=CostTable({4: host_draft}))
        grid = costs.step_ms_grid(np.array([4]), np.array([0, 1]))
        assert grid[0, 0] == pytest.approx(5.0 + floor_host)
        assert grid[1, 0] == pytest.approx(5.0 + 0.5 + host_draft)


def test_host_time_is_flat_past_the_largest_batch_measured():
    """A step's host work is mostly per step: a price measured on a small batch is not scaled
    up in proportion to a larger one (as a device forward over more rows is)."""
    s = PlannerSpec(verify_buckets=(16, 64), draft_depths=(1,), max_depth=1, floor=True)
    target, draft = CostTable({16: 5.0, 64: 9.0}), CostTable({16: 0.5, 64: 0.5})
    costs = StepCosts.price(s, target, draft, num_requests=64, context_len=None,
                            exposed=1.0, host_costs=CostTable({12: 2.0}),
                            host_draft_costs=CostTable({12: 3.0}))
    assert costs.host_ms == pytest.approx(2.0) and costs.host_draft_ms == pytest.approx(3.0)
