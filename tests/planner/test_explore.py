"""The dynamic planner's probes (planner/explore.py): when one runs, how deep it drafts, and
that it is verified at full width by the step that holds its proposal."""

import numpy as np
import pytest

from lightspec_jax.planner import PlannerSpec
from lightspec_scenarios import observe, planner, spec, warm


def probing_planner(**options):
    """Cheap draft forwards and rows, K = 7: with one draft of each proposal accepted the
    planner settles on d = 1, and its probes draft d + 2 = 3."""
    s = spec(k=7, buckets=tuple(range(1, 33)))
    return planner(s, {b: 10.0 + b for b in range(1, 33)}, {b: 1.0 for b in range(1, 33)},
                   **{"explore_fraction": 0.5, "min_probe_interval": 4, **options})


def until_a_probe_is_asked(p, n):
    """Plans and observes steps of n requests (one draft accepted) until a plan drafts the
    probe's depth 3; returns that plan, observed."""
    for _ in range(40):
        plan = p.plan(num_requests=n)
        observe(p, plan, [min(2, plan.verified_depth + 1)] * n)
        if plan.draft_depth == 3:
            return plan
    pytest.fail("no probe in 40 steps")


def test_probe_drafts_deeper_then_verifies_full_width():
    # The planner settles on d=1 (survival beyond 1 is 0).
    p = probing_planner()
    warm(p, n=4)
    reasons = []
    for _ in range(30):
        plan = p.plan(num_requests=4)
        reasons.append((plan.reason, plan.verified_depth, plan.fill_rows, plan.draft_depth))
        observe(p, plan, [2] * 4)
    probes = [r for r in reasons if r[0] == "probe"]
    assert probes, reasons
    for reason, depth, fill, _ in probes:
        assert depth == 3 and fill == 4 * (depth + 1)  # d + 2 with d = 1, at full width
    never = probing_planner(explore_fraction=0.0)
    warm(never, n=4)
    for _ in range(30):
        plan = never.plan(num_requests=4)
        assert plan.reason != "probe"
        observe(never, plan, [min(2, plan.verified_depth + 1)] * 4)


@pytest.mark.parametrize("accepted", [2, 3])
def test_a_probe_drafts_two_past_the_best_depth(accepted):
    # Every proposal's first `accepted` drafts are accepted and none after: the planner settles
    # on d = accepted, and a probe drafts d + 2 (K = 7), not deeper.
    p = probing_planner()
    warm(p, n=4)
    chosen, probes = [], []
    for _ in range(40):
        plan = p.plan(num_requests=4)
        (probes if plan.reason == "probe" else chosen).append(
            (plan.verified_depth, plan.draft_depth))
        observe(p, plan, [min(accepted, plan.verified_depth) + 1] * 4)
    assert probes, chosen
    assert {depth for depth, _ in probes} == {accepted + 2}
    assert chosen[-1][1] == accepted  # settled


def test_a_probe_is_verified_the_next_step_while_requests_come_and_go():
    # Every step a request ends and one arrives (M = N - 1): the probe's proposal is verified
    # by the very next step at the full width of the requests that hold it, and the planner
    # never drafts a probe's depth twice in a row. (Waiting for M = N kept one pending for
    # up to 130 steps at c = 256, drafting its depth each of them.)
    p = probing_planner()
    warm(p, n=4)
    plans = []
    for _ in range(40):
        plan = p.plan(num_requests=4, num_with_proposal=3)
        plans.append(plan)
        observe(p, plan, [min(2, plan.verified_depth + 1)] * 3 + [1],
                had_proposal=np.array([True, True, True, False]))
    probes = [i for i, plan in enumerate(plans) if plan.reason == "probe"]
    assert len(probes) >= 3, [(q.reason, q.draft_depth) for q in plans]
    for i in probes:
        assert plans[i].verified_depth == 3 == plans[i - 1].draft_depth  # d + 2, drafted once
        assert plans[i].fill_rows == 4 + 3 * 3  # every holder's drafts, the newcomer's row
    assert not any(a.draft_depth == b.draft_depth == 3 for a, b in zip(plans, plans[1:]))


def test_a_probe_not_drafted_as_planned_is_dropped():
    # The engine drafted shallower than the probe asked (capped near the model's length): the
    # next step is no probe, and the planner goes back to its own depth instead of asking again.
    p = probing_planner()
    warm(p, n=4)
    until_a_probe_is_asked(p, 4)
    capped = p.plan(num_requests=4, proposal_depth=2)
    assert capped.reason == "plan" and capped.verified_depth == 2
    assert capped.draft_depth < 3  # not the probe's depth again (d = 1 is best; 2 a rival)


def test_a_probe_waits_out_a_step_without_proposals():
    # c = 1: the probe's request ended as it was drafted, and the next request's first step
    # holds no proposal: its proposal is drafted at the probe's depth and verified as the probe.
    p = probing_planner()
    warm(p, n=1)
    until_a_probe_is_asked(p, 1)
    newcomer = p.plan(num_requests=1, num_with_proposal=0)
    assert newcomer.draft_depth == 3
    observe(p, newcomer, [1])
    probe = p.plan(num_requests=1)
    assert probe.reason == "probe" and probe.verified_depth == 3 and probe.fill_rows == 4


def test_a_probe_from_the_floor_drafts_two_past_the_best_drafting_depth():
    # No draft is ever accepted: the floor is the best choice. A probe asks whether drafting
    # pays again, so it drafts two past the best depth >= 1 (here 1, the cheapest), not two
    # past the floor: a depth-2 probe cannot see the long runs a lookup drafter copies
    # (math, n-gram, c = 1: the planner sat at the floor for 419 of 636 steps).
    s = PlannerSpec(verify_buckets=tuple(range(1, 33)), draft_depths=tuple(range(1, 8)),
                    max_depth=7, floor=True)
    p = planner(s, {b: 10.0 + b for b in range(1, 33)}, {b: 1.0 for b in range(1, 33)},
                explore_fraction=0.5, min_probe_interval=4)
    warm(p, n=4)
    floors, probes = 0, []
    for _ in range(60):
        plan = p.plan(num_requests=4)
        floors += plan.draft_depth == 0
        if plan.reason == "probe":
            probes.append(plan.verified_depth)
        observe(p, plan, [1] * 4)
    assert floors > 30 and probes, (floors, probes)
    assert set(probes) == {3}
