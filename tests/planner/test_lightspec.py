"""LightSpecPlanner against the scenarios of lightspec-algorithm.md §13 and the call protocol."""

import numpy as np
import pytest

from lightspec_jax.planner import (CostTable, LightSpecPlanner, PlannerSpec, StepObservation,
                                   draft_cost_ms, make_planner)
from lightspec_scenarios import STRIDE_1, observe, planner, spec, warm


def test_cold_start_verifies_full_width_at_full_depth():
    # §13.1: no costs and no statistics -> B=8, d=3; costs T=D=bs but no progress -> same
    for target in (None, {b: float(b) for b in STRIDE_1}):
        p = planner(spec(), target, target)
        warm(p)
        plan = p.plan(num_requests=2)
        assert (plan.verify_rows, plan.fill_rows, plan.draft_depth) == (8, 8, 3)
        assert plan.reason == "cold"


@pytest.mark.parametrize("with_proposal, rows, learn", [(0, 2, False), (1, 5, True),
                                                        (2, 8, True)])
def test_cold_start_with_new_requests(with_proposal, rows, learn):
    # §13.4: 0, 1 or 2 of 2 requests with proposals -> B = 2, 5, 8; a step learns from the
    # requests that held one (none: nothing to learn)
    p = planner(spec())
    warm(p)
    plan = p.plan(num_requests=2, num_with_proposal=with_proposal)
    assert plan.fill_rows == plan.verify_rows == rows
    assert plan.update_stats is learn


EAGLE_T = {2: 1.0, 4: 1.1, 8: 10.0}
EAGLE_D = {2: 0.1, 4: 0.1, 8: 0.2}


@pytest.mark.parametrize("times", [1, 8])
def test_expensive_full_width_trims_rows_and_depth(times):
    # §13.2: accept [4, 4] at (2,8,3) -> B=4, d=1, as J(2,4,1)=0.30 < J(2,4,2)=0.325 < 0.35
    p = planner(spec(buckets=(2, 4, 8)), EAGLE_T, EAGLE_D)
    warm(p)
    full = p.plan(num_requests=2)
    assert full.fill_rows == 8
    for _ in range(times):  # observations carry their plan, so one plan can be replayed
        observe(p, full, [4, 4])
    j = [p.ms_per_token(num_requests=2, fill_rows=4, depth=d) for d in (1, 2, 3)]
    assert j == pytest.approx([0.30, 0.325, 0.35])
    plan = p.plan(num_requests=2)
    assert (plan.verify_rows, plan.draft_depth) == (4, 1)


def test_objective_without_statistics():
    # §13.7: T={4:1, 8:3}, D={4:0.25, 8:1} -> J(4,8,1) = 0.5 with no statistics
    p = planner(spec(k=1, buckets=(4, 8)), {4: 1.0, 8: 3.0}, {4: 0.25, 8: 1.0})
    assert p.ms_per_token(num_requests=4, fill_rows=8, depth=1) == pytest.approx(0.5)


def test_shallow_proposal_recovers_to_a_deeper_draft():
    # §13.10: cheap rows, accept [4,4] at (2,8,3), d_prev forced to 1 -> B <= 4 but d=3
    p = planner(spec(buckets=(2, 4, 6, 8)), {2: 1.0, 4: 1.1, 6: 1.2, 8: 1.3},
                {b: 0.01 for b in (2, 4, 6, 8)})
    warm(p)
    observe(p, p.plan(num_requests=2), [4, 4])
    plan = p.plan(num_requests=2, proposal_depth=1)
    assert plan.verified_depth == 1 and plan.verify_rows <= 4
    assert plan.draft_depth == 3


def test_mixed_batch_learns_only_when_told_who_held_a_proposal():
    # §13.11: a mixed step (M < N) that does not say which requests held a proposal teaches
    # nothing; the empty batch plans nothing
    p = planner(spec())
    warm(p)
    mixed = p.plan(num_requests=2, num_with_proposal=1)
    observe(p, mixed, [4, 1])
    assert not p.stats.has_progress and not p.stats.has_survival
    empty = p.plan(num_requests=0)
    assert (empty.verify_rows, empty.fill_rows, empty.draft_depth) == (0, 0, 1)
    observe(p, empty, np.zeros(0, dtype=int))


@pytest.mark.parametrize("where", [0, 1, 2])
def test_mixed_step_teaches_what_its_proposal_holders_would_alone(where):
    # Under continuous batching most steps admit someone. The new request's lone target row is
    # left out: the statistics equal those of a step of the two holders alone, at any position.
    mixed, alone = planner(spec()), planner(spec())
    warm(mixed, n=3), warm(alone, n=2)
    held = np.ones(3, bool)
    held[where] = False
    plan = mixed.plan(num_requests=3, num_with_proposal=2)
    assert plan.update_stats and plan.fill_rows == 3 + 2 * 3
    accept = np.insert(np.array([4, 2]), where, 1)
    verify = np.insert(np.array([4, 4]), where, 1)
    observe(mixed, plan, accept, verify_lens=verify, had_proposal=held)
    observe(alone, alone.plan(num_requests=2), [4, 2], verify_lens=np.array([4, 4]))
    assert mixed.stats.entry(2, 8, 3) == alone.stats.entry(2, 8, 3) == (0.75, 1)
    np.testing.assert_array_equal(mixed.stats.survival, alone.stats.survival)
    assert mixed.stats.survival[1:].tolist() == [1.0, 0.5, 0.5]
    with pytest.raises(ValueError, match="had_proposal"):
        observe(mixed, plan, accept, had_proposal=held[:2])


def test_overlapped_calls_learn_from_the_executed_plan():
    # The engine plans step i+1 before it observes step i. The depth plan i+1 verifies is the
    # depth plan i drafted; statistics land on the key each observation's own plan ran with.
    p = planner(spec(buckets=(2, 4, 8)), EAGLE_T, EAGLE_D)
    plans = [p.plan(num_requests=2)]
    plans.append(p.plan(num_requests=2))  # plan 1 before observe 0
    observe(p, plans[0], [1, 1])  # step 0 verified nothing (no proposal): nothing to learn
    assert not p.stats.has_progress
    plans.append(p.plan(num_requests=2))  # still cold: step 1 not observed yet
    assert plans[2].reason == "cold" and plans[2].verified_depth == plans[1].draft_depth
    observe(p, plans[1], [4, 4])
    assert p.stats.entry(2, plans[1].fill_rows, plans[1].verified_depth) == (1.0, 1)
    plans.append(p.plan(num_requests=2))
    assert plans[3].reason == "plan" and plans[3].verified_depth == plans[2].draft_depth
    assert (plans[3].verify_rows, plans[3].draft_depth) == (4, 1)
    observe(p, plans[2], [4, 4])  # a late observation still updates its own key
    assert p.stats.entry(2, 8, 3)[1] == 2


def test_measured_times_refresh_the_cost_tables():
    p = planner(spec(buckets=(2, 4, 8)), EAGLE_T, EAGLE_D)
    warm(p)
    plan = p.plan(num_requests=2)
    observe(p, plan, [4, 4], target_ms=20.0, draft_ms=0.2 + 2 * 0.1 * 3, context_len=0)
    assert p.target_costs.estimate(8) == pytest.approx(0.9 * 10.0 + 0.1 * 20.0)
    # the draft run (D(8) + 2 D(2) predicted 0.4, measured 0.8) is split in proportion
    assert p.draft_costs.estimate(8) == pytest.approx(0.9 * 0.2 + 0.1 * 0.4)
    assert p.draft_costs.estimate(2) == pytest.approx(0.9 * 0.1 + 0.1 * 0.2)


def test_cheap_rows_verify_everything_and_expensive_rows_trim():
    # The planner picks the cheaper configuration when costs say so.
    accept = [2, 3, 1, 4]
    flat = planner(spec(), {b: 5.0 for b in STRIDE_1}, {b: 0.001 for b in STRIDE_1})
    steep = planner(spec(), {b: 1.0 + b for b in STRIDE_1}, {b: 0.001 for b in STRIDE_1})
    for p in (flat, steep):
        warm(p, n=4)
        observe(p, p.plan(num_requests=4), accept)
    assert flat.plan(num_requests=4).fill_rows == 16
    assert steep.plan(num_requests=4).fill_rows < 16


def test_bad_calls_get_actionable_errors():
    p = planner(spec(buckets=(2, 4, 8)))
    with pytest.raises(ValueError, match="largest verify bucket 8"):
        p.plan(num_requests=9)
    with pytest.raises(ValueError, match="cannot exceed"):
        p.plan(num_requests=2, num_with_proposal=3)
    with pytest.raises(ValueError, match="num_requests"):
        p.plan(num_requests=-1)
    warm(p)
    plan = p.plan(num_requests=2)
    with pytest.raises(ValueError, match="shape"):
        observe(p, plan, [1, 1, 1])
    with pytest.raises(ValueError, match=r"\[1, 4\]"):
        observe(p, plan, [5, 1])
    with pytest.raises(ValueError, match="unknown option"):
        make_planner("dynamic", spec(), depth=3)
    with pytest.raises(ValueError, match="unknown planner"):
        make_planner("greedy", spec())


def test_spec_validation():
    with pytest.raises(ValueError, match="strictly increasing"):
        PlannerSpec(verify_buckets=(4, 2), draft_depths=(1,), max_depth=1)
    with pytest.raises(ValueError, match="subset"):
        PlannerSpec(verify_buckets=(4,), draft_depths=(0, 1), max_depth=1)
    with pytest.raises(ValueError, match="whole block"):
        PlannerSpec(verify_buckets=(4,), draft_depths=(1, 2), max_depth=2,
                    drafter_kind="parallel")
    with pytest.raises(ValueError, match="block_lead must be in"):
        PlannerSpec(verify_buckets=(4,), draft_depths=(1, 2), max_depth=2,
                    drafter_kind="parallel", block_size=3, block_lead=2)
    with pytest.raises(ValueError, match="parallel drafters only"):
        PlannerSpec(verify_buckets=(4,), draft_depths=(1,), max_depth=1, block_lead=1)
    s = PlannerSpec(verify_buckets=[8, 16], draft_depths=[3, 1, 2], max_depth=3)
    assert s.draft_depths == (1, 2, 3) and s.verify_buckets == (8, 16)
    assert isinstance(make_planner("lightspec", s), LightSpecPlanner)


def test_depth_table_prices_the_measured_draft_stage():
    # Without a depth table each further depth costs one draft forward over N rows; with one,
    # the drafting stage costs what was measured for its depth.
    s = spec(k=3, buckets=(2, 4, 8))
    draft = CostTable({2: 0.25, 4: 0.3, 8: 0.4})
    stage = CostTable({1: 0.01, 2: 0.05, 3: 0.08})
    assert draft_cost_ms(s, draft, num_requests=2, verify_rows=8, depth=3) == pytest.approx(0.9)
    assert draft_cost_ms(s, draft, num_requests=2, verify_rows=8, depth=3,
                         depth_costs=stage) == pytest.approx(0.4 + 0.08)
    # Verify rows are cheap and every draft is accepted: only the draft stage holds the depth
    # back. Priced per forward (1.2 ms a depth) depth 1 wins; priced as measured, depth 3.
    target = {2: 1.0, 4: 1.05, 8: 1.1}
    picks = []
    for depth_costs in (None, stage):
        p = make_planner("dynamic", s, target_costs=CostTable(target),
                         draft_costs=CostTable({2: 1.2, 4: 1.2, 8: 1.2}),
                         depth_costs=depth_costs, explore_fraction=0.0)
        warm(p)
        observe(p, p.plan(num_requests=2), [4, 4])
        picks.append(p.plan(num_requests=2).draft_depth)
    assert picks == [1, 3]


def test_step_time_is_split_over_verify_and_the_draft_run_it_timed():
    s = spec(k=3, buckets=(2, 4, 8))
    p = make_planner("dynamic", s, target_costs=CostTable(EAGLE_T),
                     draft_costs=CostTable(EAGLE_D), depth_costs=CostTable({1: 0.1, 2: 0.2,
                                                                            3: 0.3}))
    warm(p)
    earlier = p.plan(num_requests=2)  # verify 8 rows (cold), then draft depth 3
    plan = p.plan(num_requests=2)
    # One interval timed the earlier step's draft run (D(8) = 0.2, stage(3) = 0.3) and this
    # step's verify (T(B)); predicted T(B) + 0.5, measured twice that: every part doubles.
    predicted = EAGLE_T[plan.verify_rows] + 0.2 + 0.3
    p.observe(StepObservation(plan=plan, accept_lens=np.array([1, 1]), step_ms=2 * predicted,
                              draft_plan=earlier))
    assert p.target_costs.estimate(plan.verify_rows) == pytest.approx(
        1.1 * EAGLE_T[plan.verify_rows])
    assert p.draft_costs.estimate(8) == pytest.approx(1.1 * 0.2)
    assert p.depth_costs.estimate(3) == pytest.approx(1.1 * 0.3)
    # a step whose own draft run was timed with it
    q = make_planner("dynamic", s, target_costs=CostTable(EAGLE_T),
                     draft_costs=CostTable(EAGLE_D))
    warm(q)
    plan = q.plan(num_requests=2)  # 8 rows, depth 3: D(8) + 2 D(2) = 0.4
    q.observe(StepObservation(plan=plan, accept_lens=np.array([1, 1]), step_ms=2 * 10.4))
    assert q.target_costs.estimate(8) == pytest.approx(11.0)
    assert q.draft_costs.estimate(2) == pytest.approx(0.11)


def test_floor_costs_no_drafter_forward_and_host_time_hides_under_overlap():
    # The floor verifies and writes the drafter's cache (inside the verify's price): no
    # commit forward, no drafting stage.
    from lightspec_jax.planner.objective import StepCosts
    s = spec(k=3, buckets=(4, 8, 16))
    target, draft = CostTable({4: 5.0, 8: 9.0, 16: 17.0}), CostTable({4: 0.1, 8: 0.1, 16: 0.1})
    depth = CostTable({1: 0.5, 2: 1.0, 3: 1.5})
    for exposed, host, floor_ms in ((0.0, 2.0, 5.0), (0.0, 8.0, 8.0), (1.0, 2.0, 7.0)):
        costs = StepCosts.price(s, target, draft, num_requests=4, context_len=None,
                                depth_costs=depth, host_costs=CostTable({4: host}),
                                exposed=exposed)
        assert costs.step_ms(np.array([4]), 0)[0] == pytest.approx(floor_ms)
        device = 5.1 + 1.0  # B = 4, depth 2
        expect = device + host if exposed else max(device, host)
        assert costs.step_ms(np.array([4]), 2)[0] == pytest.approx(expect)


def test_floor_when_nothing_is_accepted_and_deep_when_host_bound():
    """Nothing accepted: the floor (draft nothing) is cheapest. The same statistics with a
    host that takes longer than any device step: rows and depth are free under overlap, and
    speculation's rare accepted token makes it worth drafting."""
    s = PlannerSpec(verify_buckets=tuple(range(1, 33)), draft_depths=(1, 2, 3), max_depth=3,
                    floor=True)
    target = {b: 1.0 + 0.2 * b for b in range(1, 33)}
    draft = {b: 0.05 for b in range(1, 33)}
    depth = CostTable({1: 0.3, 2: 0.6, 3: 0.9})  # each drafted token costs 0.3 ms
    for host, expect_floor in ((None, True), (100.0, False)):
        p = make_planner("dynamic", s, target_costs=CostTable(target),
                         draft_costs=CostTable(draft), depth_costs=depth,
                         explore_fraction=0.0,
                         host_costs=None if host is None else CostTable({4: host}))
        warm(p, n=4)
        for _ in range(10):
            plan = p.plan(num_requests=4)
            accept = np.ones(4, int)
            if plan.fill_rows > 4:  # request 0's first draft, the rest rejected
                accept[0] = 2
            observe(p, plan, accept)
        plan = p.plan(num_requests=4)
        assert (plan.draft_depth == 0) is expect_floor, plan


def test_request_ends_cap_the_fill_and_the_next_depth():
    """Requests with 1-2 tokens left: no draft row past the allowance is ever planned."""
    s = spec(k=4, buckets=tuple(range(1, 33)))
    p = planner(s, {b: 1.0 for b in range(1, 33)}, {b: 0.01 for b in range(1, 33)})
    warm(p, n=4)
    plan = p.plan(num_requests=4, remaining=np.array([1, 2, 50, 50]))
    # rows: 4 target rows + 0 + 1 + 4 + 4 drafts
    assert plan.full_rows == 4 + 0 + 1 + 4 + 4 and plan.fill_rows <= plan.full_rows
    observe(p, plan, [1, 2, 5, 5], verify_lens=np.array([1, 2, 5, 5]))
    # the censored requests (rows cut at their allowance) teach the survival nothing
    assert p.stats.survival[4] == pytest.approx(1.0)


@pytest.mark.parametrize("hits, depth", [(0, 0), (3, 0), (4, 1)])
def test_floor_needs_a_margin_over_a_useful_depth(hits, depth):
    """8 requests, `hits` of them accepting their first draft, drafting near-free (0.01 ms):
    depth 1 verified at 16 rows prices 2.5% (3 hits) or 1% (4 hits) above the floor. Within
    the 2% margin the floor loses (it would forfeit the next proposal and what it teaches);
    past it, it wins. With nothing accepted, depth 1 verified at one row per request - no
    draft verified, only drafting paid for - is no choice at all, however cheap drafting is."""
    s = PlannerSpec(verify_buckets=tuple(range(1, 33)), draft_depths=(1, 2, 3), max_depth=3,
                    floor=True)
    p = make_planner("dynamic", s, target_costs=CostTable({b: 1.0 + 0.2 * b for b in range(1, 33)}),
                     draft_costs=CostTable({b: 0.01 for b in range(1, 33)}),
                     explore_fraction=0.0)
    warm(p, n=8)
    for _ in range(30):
        plan = p.plan(num_requests=8)
        accept = np.ones(8, int)
        accept[:hits] = min(2, plan.verified_depth + 1)
        observe(p, plan, accept)
    plan = p.plan(num_requests=8)
    assert plan.draft_depth == depth


def test_a_depth_is_chosen_only_with_a_fill_that_reaches_it():
    """One request, rows past 3 priced out: the fill verifies at most 2 drafts, so depths 3-7
    verify what depth 2 does and only draft more. Even when the token calibration favours
    deeper proposals (here 1 + 0.05 d, as a lucky run of deep steps can leave it), the next
    depth is at most 2: a depth is a choice only with a fill that reaches its deepest level."""
    buckets = tuple(range(1, 9))
    s = PlannerSpec(verify_buckets=buckets, draft_depths=tuple(range(1, 8)), max_depth=7,
                    floor=True)
    p = make_planner("dynamic", s,
                     target_costs=CostTable({b: 1.0 if b <= 3 else 100.0 for b in buckets}),
                     draft_costs=CostTable({b: 0.01 for b in buckets}), explore_fraction=0.0)
    p.tokens.factors = lambda depths: 1.0 + 0.05 * np.asarray(depths, dtype=float)
    warm(p, n=1)
    for _ in range(10):
        plan = p.plan(num_requests=1)
        observe(p, plan, np.array([plan.verified_depth + 1]))  # every draft accepted
    assert p.plan(num_requests=1).draft_depth == 2
