"""StaticPlanner and DSparkPlanner."""

import numpy as np
import pytest

from lightspec_jax.planner import (CostTable, DSparkPlanner, PlannerSpec, StaticPlanner,
                                   StepObservation, make_planner)


def spec(k=3, buckets=(2, 4, 8)):
    return PlannerSpec(verify_buckets=buckets, draft_depths=tuple(range(1, k + 1)), max_depth=k)


def test_static_always_verifies_every_drafted_row():
    p = make_planner("static", spec(k=3, buckets=(1, 2, 4, 6, 8, 12, 16)), depth=2)
    first = p.plan(num_requests=3)
    assert (first.fill_rows, first.verify_rows, first.draft_depth) == (3, 4, 2)
    for n, m in [(3, 3), (4, 4), (4, 2), (5, 5)]:
        plan = p.plan(num_requests=n, num_with_proposal=m)
        assert plan.fill_rows == n + m * 2
        assert plan.verify_rows == min(b for b in (1, 2, 4, 6, 8, 12, 16) if b >= plan.fill_rows)
        assert plan.draft_depth == 2 and plan.reason == "static"
    with pytest.raises(ValueError, match="not an allowed draft depth"):
        StaticPlanner(spec(k=3), depth=5)


def test_static_caps_the_fill_at_the_largest_bucket():
    p = make_planner("static", spec(k=3, buckets=(2, 4, 6)))
    p.plan(num_requests=2)
    assert p.plan(num_requests=2).fill_rows == 6  # 2 * 4 = 8 rows do not fit


DSPARK_T = {2: 1.0, 4: 1.1, 8: 10.0}
DSPARK_D = {6: 0.5}


def dspark(target=DSPARK_T, delay=2):
    # DSpark drafts with a block drafter: draft cost D(B) + D(N * block), block = K = 3.
    block = PlannerSpec(verify_buckets=(2, 4, 8), draft_depths=(3,), max_depth=3,
                        drafter_kind="parallel")
    p = make_planner("dspark", block, target_costs=CostTable(target),
                     draft_costs=CostTable(DSPARK_D), capacity_delay=delay)
    first = p.plan(num_requests=2)  # no proposal yet
    assert first.fill_rows == 2
    return p


def test_dspark_capacity_is_applied_two_steps_late():
    # §13.12: confidence 0.9 at all 3 positions of 2 requests -> B=8 first, B=4 second
    p = dspark()
    conf = np.full((2, 3), 0.9)
    assert p.plan(num_requests=2, confidences=conf).verify_rows == 8
    assert p.plan(num_requests=2, confidences=conf).verify_rows == 4


def test_dspark_applies_the_capacity_computed_from_the_previous_call():
    p = dspark()
    confident, hopeless = np.full((2, 3), 0.9), np.full((2, 3), 0.01)
    assert p.plan(num_requests=2, confidences=confident).verify_rows == 8  # queue fills
    assert p.plan(num_requests=2, confidences=hopeless).verify_rows == 4  # from `confident`
    assert p.plan(num_requests=2, confidences=confident).verify_rows == 2  # from `hopeless`
    undelayed = dspark(delay=1)
    assert undelayed.plan(num_requests=2, confidences=hopeless).verify_rows == 2


def test_dspark_exact_tie_keeps_the_smaller_budget():
    # §13.12: T(4)=1.2 and survival 0.1/0.01/0.001: B=2 and B=4 both give 1.0 token/ms
    p = dspark(target={2: 1.0, 4: 1.2, 8: 10.0})
    conf = np.full((2, 3), 0.1)
    p.plan(num_requests=2, confidences=conf)
    assert p.plan(num_requests=2, confidences=conf).verify_rows == 2
    # with survival 0.9/0.81/0.729 the extra rows pay -> B=4
    q = dspark(target={2: 1.0, 4: 1.2, 8: 10.0})
    conf = np.full((2, 3), 0.9)
    q.plan(num_requests=2, confidences=conf)
    assert q.plan(num_requests=2, confidences=conf).verify_rows == 4


def test_dspark_ignores_missing_draft_tokens_and_falls_back_to_full_width():
    p = dspark()
    masked = np.array([[0.9, np.nan, 0.9], [0.0, 0.9, 0.9]])  # 1 usable row in all
    p.plan(num_requests=2, confidences=masked)
    plan = p.plan(num_requests=2, confidences=masked)
    assert plan.fill_rows <= 3
    assert p.plan(num_requests=2).fill_rows == 8  # no confidences: verify everything
    assert p.plan(num_requests=2).draft_depth == 3  # DSpark always drafts the whole block
    with pytest.raises(ValueError, match="confidences"):
        p.plan(num_requests=2, confidences=np.ones(3))


def test_dspark_clamps_a_stale_capacity_to_the_current_batch():
    p = dspark()
    p.plan(num_requests=2, confidences=np.full((2, 3), 0.01))  # computes u=2 for N=2
    plan = p.plan(num_requests=4, confidences=np.full((4, 3), 0.9))
    assert plan.fill_rows >= 4  # every request keeps its target row


def test_baselines_accept_observations():
    for p in (make_planner("static", spec()), dspark()):
        p.plan(num_requests=2, confidences=np.full((2, 3), 0.5))
        plan = p.plan(num_requests=2, confidences=np.full((2, 3), 0.5))
        p.observe(StepObservation(plan=plan, accept_lens=np.array([1, 2]), target_ms=3.0,
                                  draft_ms=1.0, context_len=10))
        assert isinstance(p, (StaticPlanner, DSparkPlanner))
