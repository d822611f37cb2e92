"""replan_every: a decision is reused for a few steps of nearly one shape (the depth verified,
N within 1/32, as many requests ending within reach, the verify bucket), never across a
larger change; replan_limit: while fresh
decisions choose the floor again, that window doubles up to the limit; a drafting decision
keeps (or sets back) the short one; hidden_host_share: an overlapped loop that hides the host
under the device with room to spare decides every step."""

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, PlannerSpec, StepObservation, make_planner

BUCKETS = tuple(range(1, 65))


def planner(buckets=BUCKETS, floor=False, draft_ms=0.01, overlap=False, host_ms=None,
            **options):
    """A planner whose loop does not hide host time (overlap=False, as on the CPU backend),
    so reuse follows replan_every alone; host_ms: a measured host time for every N."""
    s = PlannerSpec(verify_buckets=buckets, draft_depths=(1, 2, 3), max_depth=3, floor=floor)
    rows = {b: 1.0 + 0.05 * b for b in buckets}
    host = None if host_ms is None else CostTable({n: host_ms for n in buckets})
    # No probes: a probe is a decision of its own and never reused.
    return make_planner("dynamic", s, target_costs=CostTable(rows),
                        draft_costs=CostTable({b: draft_ms for b in buckets}),
                        host_costs=host, overlap=overlap, explore_fraction=0.0, **options)


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
    with pytest.raises(ValueError, match="replan_limit"):
        planner(replan_every=4, replan_limit=2)


def counting(p):
    """p, with the list that its fresh decisions append to."""
    decided = []
    original = p._next_depth
    p._next_depth = lambda *a, **k: decided.append(p.steps) or original(*a, **k)
    return decided


def test_the_floor_chosen_again_grows_the_window_up_to_replan_limit():
    # Drafts stop being accepted at step 30: both planners go to the floor (no probes here),
    # and there the grown one decides 4, 8, then every 16 steps apart.
    def accept(i):
        return 3 if i < 30 else 0
    steady = planner(floor=True, draft_ms=0.5, replan_every=4)
    grown = planner(floor=True, draft_ms=0.5, replan_every=4, replan_limit=16)
    for p in (steady, grown):
        assert run(p, 60, accept)[-1].draft_depth == 0
    counts = [counting(steady), counting(grown)]
    for p in (steady, grown):
        assert all(q.draft_depth == 0 for q in run_from(p, 60, 156, accept))
    assert len(counts[0]) >= 96 // 4
    assert len(counts[1]) <= 96 // 16 + 3
    assert np.diff(counts[1]).max() == 16


def test_drafting_decisions_keep_the_short_window():
    # A steady depth 2 decides every replan_every steps, replan_limit or not.
    p = planner(replan_every=4, replan_limit=16)
    run(p, 20, lambda i: 2)
    decided = counting(p)
    run(p, 96, lambda i: 2)
    assert len(decided) >= 96 // 4 - 1 and np.diff(decided).max() <= 4


def test_a_drafting_decision_sets_the_window_back():
    # The rule itself, over a sequence of fresh decisions' depths: the floor again doubles
    # the window, anything else (leaving the floor, or the first floor after drafting) sets
    # it back to replan_every.
    p = planner(floor=True, replan_every=4, replan_limit=16)
    horizons = []
    for depth in (0, 0, 0, 0, 2, 0, 0, 3, 3):
        p._grow_horizon(depth)
        horizons.append(p._horizon)
    assert horizons == [4, 8, 16, 16, 4, 4, 8, 4, 4]


def run_from(p, start, stop, accept_of, n=16):
    """run(), for steps start..stop - 1 of the same accept_of."""
    return run(p, stop - start, lambda i: accept_of(start + i), n=n)


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
        if new:  # a decision that changed the depth: the next step verifies the new one
            last = plan if plan.draft_depth == plan.verified_depth else None
        elif last is None:
            last = plan
        else:  # the same rows and depth; drafts accepted per draft row kept
            assert plan.fill_rows == last.fill_rows and plan.draft_depth == last.draft_depth
            n, n0, rows = plan.num_requests, last.num_requests, plan.fill_rows
            assert plan.predicted_tokens - n == pytest.approx(
                (last.predicted_tokens - n0) * (rows - n) / (rows - n0))
    (anchor, _, _, _), _, _ = p._decided
    before = len(decided)
    p.plan(num_requests=anchor + anchor // 32 + 1)
    assert len(decided) == before + 1


def test_a_decision_that_changes_the_depth_is_reused_by_the_next_step():
    # Acceptance collapses at step 30 and the planner leaves depth 3. The steps after that
    # fresh decision verify its new depth, so they reuse it: keyed by the depth the decision
    # verified, the step after any change of depth decided afresh.
    def accept(i):
        return 3 if i < 30 else 0
    p = planner(replan_every=4)
    run(p, 30, accept)
    decided = counting(p)
    plans = run_from(p, 30, 60, accept)
    change = next(i for i, q in enumerate(plans) if q.draft_depth != 3)
    steps = [at - 30 for at in decided]
    assert change in [s - 1 for s in steps]  # plan() counts itself before deciding
    assert change + 1 not in [s - 1 for s in steps]
    after = plans[change + 1]
    assert after.verified_depth == plans[change].draft_depth
    assert after.fill_rows >= after.num_requests
    assert np.diff(decided).min() >= 1 and len(decided) <= 30 // 4 + 3


@pytest.mark.parametrize("host_ms, reused", [(0.2, False), (2.5, True)])
def test_an_overlapped_loop_that_hides_the_host_decides_every_step(host_ms, reused):
    # 16 requests at depth 3 verify 48 rows, about 3.4 ms of device time here. An overlapped
    # loop hides 0.2 ms of host time under it (at most hidden_host_share of the step):
    # deciding afresh costs the step nothing, so every plan() decides. 2.5 ms is over half
    # the step: decisions are reused as replan_every says. Without overlap the host adds up
    # and reuse always applies.
    p = planner(replan_every=4, overlap=True, host_ms=host_ms)
    run(p, 20, lambda i: 2)
    decided = counting(p)
    run(p, 40, lambda i: 2)
    assert (len(decided) <= 40 // 4 + 2) if reused else len(decided) == 40
    summed = planner(replan_every=4, overlap=False, host_ms=0.2)
    run(summed, 20, lambda i: 2)
    decided = counting(summed)
    run(summed, 40, lambda i: 2)
    assert len(decided) <= 40 // 4 + 2


def test_hidden_host_share_zero_reuses_regardless():
    p = planner(replan_every=4, overlap=True, host_ms=0.2, hidden_host_share=0.0)
    run(p, 20, lambda i: 2)
    decided = counting(p)
    run(p, 40, lambda i: 2)
    assert len(decided) <= 40 // 4 + 2
    with pytest.raises(ValueError, match="hidden_host_share"):
        planner(hidden_host_share=1.5)


def test_a_floor_chosen_for_a_last_token_is_not_kept_for_the_next_request():
    # One request at a time (c = 1), every draft accepted: a request's last steps have no
    # room to draft (the floor), and the next request starts with all of its allowance -
    # its steps draft again at once rather than keep the floor for the reuse window (on the
    # shipped pair at math c = 1, 48 of 676 steps drafted nothing with the whole allowance
    # ahead).
    p = planner(floor=True, draft_ms=0.05, replan_every=4, replan_limit=16)
    floors_with_room = 0
    for request in range(12):
        remaining = 42  # 4 tokens a step, then 2 and 1 left: two floor steps end it
        while remaining > 0:
            plan = p.plan(num_requests=1, num_with_proposal=int(remaining < 42),
                          remaining=np.array([remaining]))
            emitted = min(plan.verified_depth + 1, remaining)
            p.observe(StepObservation(plan=plan, accept_lens=np.array([emitted])))
            if request >= 2 and remaining > 3 * (p.spec.max_depth + 1):
                floors_with_room += plan.draft_depth == 0
            remaining -= emitted
    assert floors_with_room == 0
