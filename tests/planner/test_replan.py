"""replan_every: a decision is reused for a few steps of nearly one shape (the depth verified,
N within 1/32, the verify bucket), never across a larger change."""

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, PlannerSpec, StepObservation, make_planner

BUCKETS = tuple(range(1, 65))


def planner(buckets=BUCKETS, **options):
    s = PlannerSpec(verify_buckets=buckets, draft_depths=(1, 2, 3), max_depth=3)
    rows = {b: 1.0 + 0.05 * b for b in buckets}
    # No probes: a probe is a decision of its own and never reused.
    return make_planner("dynamic", s, target_costs=CostTable(rows),
                        draft_costs=CostTable({b: 0.01 for b in buckets}),
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


def test_a_batch_a_few_requests_larger_or_smaller_reuses_the_decision():
    # A serving batch gains and loses a request every step (96 +- 1): the decision is still
    # made once per window, a reused one keeps its rows (every request's target row among
    # them) and expects tokens for the batch it serves; a few requests more (over 1/32 of the
    # decision's N) decide afresh.
    p = planner(buckets=tuple(range(1, 257)), replan_every=4)
    run(p, 20, lambda i: 2, n=96)
    decided = []
    original = p._next_depth
    p._next_depth = lambda *a, **k: decided.append(1) or original(*a, **k)
    sizes = [96, 97, 96, 95] * 15
    plans, fresh = [], []
    for n in sizes:
        before = len(decided)
        plan = p.plan(num_requests=n)
        plans.append(plan)
        fresh.append(len(decided) > before)
        p.observe(StepObservation(plan=plan, accept_lens=np.full(
            n, min(2, plan.verified_depth) + 1)))
    assert sum(fresh) <= len(sizes) // 4 + 3
    last = None
    for plan, new in zip(plans, fresh):
        if new:
            last = plan
        elif last is not None:  # the same rows and depth; drafts accepted per draft row kept
            assert plan.fill_rows == last.fill_rows and plan.draft_depth == last.draft_depth
            n, n0, rows = plan.num_requests, last.num_requests, plan.fill_rows
            assert plan.predicted_tokens - n == pytest.approx(
                (last.predicted_tokens - n0) * (rows - n) / (rows - n0))
    (anchor, _, _), _, _ = p._decided
    before = len(decided)
    p.plan(num_requests=anchor + anchor // 32 + 1)
    assert len(decided) == before + 1
