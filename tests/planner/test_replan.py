"""replan_every: a decision is reused for a few steps of one shape, never across a change."""

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, PlannerSpec, StepObservation, make_planner

BUCKETS = tuple(range(1, 65))


def planner(**options):
    s = PlannerSpec(verify_buckets=BUCKETS, draft_depths=(1, 2, 3), max_depth=3)
    rows = {b: 1.0 + 0.05 * b for b in BUCKETS}
    # No probes: a probe is a decision of its own and never reused.
    return make_planner("dynamic", s, target_costs=CostTable(rows),
                        draft_costs=CostTable({b: 0.01 for b in BUCKETS}),
                        explore_fraction=0.0, **options)


def run(p, steps, accept_of, n=16):
    """Plans `steps` steps of n requests, observing each with accept_of(step) for all."""
    plans = []
    for i in range(steps):
        plan = p.plan(num_requests=n)
        plans.append(plan)
        accept = np.full(n, min(accept_of(i), plan.verified_depth) + 1)
        p.observe(StepObservation(plan=plan, accept_lens=accept))
    return plans


def flips(plans):
    return sum(a.draft_depth != b.draft_depth for a, b in zip(plans, plans[1:]))


def test_reused_decision_lags_at_most_replan_every_steps():
    # Acceptance collapses at step 30: an every-step planner and a replan_every=4 planner see
    # the same statistics, and the second follows within 4 steps of the first.
    def accept(i):
        return 3 if i < 30 else 0
    fresh = run(planner(), 60, accept)
    lazy = run(planner(replan_every=4), 60, accept)
    first_shallow = next(i for i, p in enumerate(fresh) if i >= 30 and p.draft_depth == 1)
    lazy_shallow = next(i for i, p in enumerate(lazy) if i >= 30 and p.draft_depth == 1)
    assert fresh[29].draft_depth == 3 and lazy[29].draft_depth == 3
    assert first_shallow <= lazy_shallow < first_shallow + 4


def test_a_steady_shape_decides_once_per_window():
    p = planner(replan_every=4)
    run(p, 20, lambda i: 2)  # past the cold start, a proposal at a steady depth
    decided = []
    original = p._next_depth
    p._next_depth = lambda *a, **k: decided.append(1) or original(*a, **k)
    run(p, 40, lambda i: 2)
    assert 10 <= len(decided) <= 12  # every 4th step, plus a shape change or two


def test_a_change_of_shape_decides_afresh():
    p = planner(replan_every=1000)
    run(p, 20, lambda i: 3)
    four = p.plan(num_requests=4)
    six = p.plan(num_requests=6)  # a new N: not the 4-request decision
    assert six.num_requests == 6 and six.fill_rows >= 6
    assert six.verify_rows != four.verify_rows


def test_replan_every_must_be_positive():
    with pytest.raises(ValueError, match="replan_every"):
        planner(replan_every=0)
