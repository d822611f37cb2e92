"""Stage 2 prices every depth in one grid, and stage 1 reads its row from it: both must agree
with pricing each depth on its own."""

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, make_planner
from lightspec_jax.planner.survival import non_increasing
from test_lightspec import observe, spec


def test_stage_two_searches_every_depth_like_the_per_depth_loop():
    # _next_depth prices all depths in one [D, C] grid; it must agree with pricing each
    # depth's candidates on their own (candidate_rows + progress_many), ties included.
    from lightspec_jax.planner.objective import StepCosts, candidate_rows

    rng = np.random.default_rng(3)
    for trial in range(20):
        k = int(rng.integers(1, 12))
        buckets = tuple(sorted({int(x) for x in rng.integers(1, 12 * (k + 1), size=9)}
                               | {12 * (k + 1)}))
        s = spec(k=k, buckets=buckets)
        p = make_planner("dynamic", s,
                         target_costs=CostTable({b: 1 + rng.random() * b for b in buckets}),
                         draft_costs=CostTable({b: 0.1 + 0.01 * b for b in buckets}),
                         depth_costs=CostTable({d: 0.2 * d for d in range(1, k + 1)})
                         if trial % 2 else None)
        for _ in range(15):
            n = int(rng.integers(1, 13))
            plan = p.plan(num_requests=n)
            accept = (np.minimum(rng.geometric(0.3, size=n), plan.verified_depth + 1)
                      if plan.verified_depth else np.ones(n, int))
            observe(p, plan, accept)
            costs = StepCosts.price(s, p.target_costs, p.draft_costs, num_requests=n,
                                    context_len=None, depth_costs=p.depth_costs,
                                    linear_depth=p.linear_depth)
            best = []
            for depth in s.draft_depths:
                u, b = candidate_rows(s, n, min(n * (depth + 1), s.max_requests))
                tokens = u * p.stats.progress_many(n, u, depth, now=p.steps)  # u ascends
                if (np.diff(tokens) < 0).any():  # in order: least squares, non-decreasing
                    tokens = -non_increasing(-tokens, np.ones(len(tokens)))
                tokens = np.clip(tokens, n, n * (depth + 1))
                tokens = n + p.tokens.factors([depth])[0] * (tokens - n)  # drafts calibrated
                best.append(float(np.min(costs.step_ms(b, depth) / tokens)))
            want = next(d for d, j in zip(s.draft_depths, best)
                        if j == min(best)) if len(set(best)) == len(best) else None
            got_depth, got_j = p._next_depth(costs, n)
            assert got_j == pytest.approx(min(best), rel=1e-12)
            if want is not None:
                assert got_depth == want


def test_stage_one_read_from_stage_two_equals_its_own_pricing():
    # plan() runs stage 2 first, and stage 1 reads this step's depth from its grid when no
    # request's end is near; the choice, its ms and tokens must equal pricing it alone.
    from lightspec_jax.planner.objective import StepCosts

    rng = np.random.default_rng(7)
    reused = 0
    for trial in range(20):
        k = int(rng.integers(1, 8))
        top = int(rng.integers(8, 8 * (k + 1) + 1))  # often below 8 requests' full width
        buckets = tuple(sorted({int(x) for x in rng.integers(1, top, size=7)} | {top}))
        s = spec(k=k, buckets=buckets)
        p = make_planner("dynamic", s,
                         target_costs=CostTable({b: 1 + rng.random() * b for b in buckets}),
                         draft_costs=CostTable({b: 0.1 + 0.01 * b for b in buckets}))
        for _ in range(30):
            n = int(rng.integers(1, 9))
            remaining = rng.integers(1, 3 * k, size=n) if rng.random() < 0.5 else None
            plan = p.plan(num_requests=n, remaining=remaining)
            accept = (np.minimum(rng.geometric(0.3, size=n), plan.verified_depth + 1)
                      if plan.verified_depth else np.ones(n, int))
            observe(p, plan, accept)
            costs = StepCosts.price(s, p.target_costs, p.draft_costs, num_requests=n,
                                    context_len=None)
            d_prev = p.plan(num_requests=n, remaining=remaining).verified_depth  # its room
            if d_prev == 0:
                continue
            available = min(p._full_rows, s.max_requests)
            p._stage2 = None
            alone = p._evaluate(costs, n, available, d_prev)
            p._next_depth(costs, n)
            grids = []
            p._grid = lambda *a, _g=p._grid: grids.append(1) or _g(*a)
            assert p._evaluate(costs, n, available, d_prev) == alone
            assert p._evaluate(costs, n, available, d_prev, full=True)[0] == available
            reused += not grids
            del p._grid
            p._stage2 = None
    assert reused > 20  # the shortcut was exercised


def test_more_rows_never_price_fewer_tokens():
    # A fill of u + 1 rows verifies every position a fill of u rows does, so the planner
    # never expects it to commit fewer tokens - even when its estimates disagree: here a
    # trimmed key's EMA (1 request, 3 rows, depth 3: both drafts accepted every time) says
    # more than the pooled survival says of the full 4 rows (n-gram, ShareGPT, c = 1).
    from lightspec_jax.planner import StepPlan
    from lightspec_jax.planner.objective import StepCosts

    s = spec(k=3, buckets=(1, 2, 3, 4))
    costs = {b: 1.0 + 0.1 * b for b in s.verify_buckets}
    p = make_planner("dynamic", s, target_costs=CostTable(costs),
                     draft_costs=CostTable({b: 0.1 for b in s.verify_buckets}))
    rng = np.random.default_rng(0)
    for step in range(64):
        full = step % 2 == 0
        plan = StepPlan(num_requests=1, num_with_proposal=1, verified_depth=3,
                        fill_rows=4 if full else 3, verify_rows=4 if full else 3,
                        draft_depth=3, update_stats=True, reason="plan", full_rows=4)
        accept = [min(int(rng.geometric(0.6)), 4)] if full else [3]
        observe(p, plan, accept)
    c = StepCosts.price(s, p.target_costs, p.draft_costs, num_requests=1, context_len=None)
    u = np.array([[1, 2, 3, 4]])
    raw = u[0] * p.stats.progress_grid(1, u, np.array([3]), now=p.steps)[0]
    assert raw[2] > raw[3]  # the estimates disagree: the test has teeth
    g = p._grid(c, 1, np.array([3]), np.array([4]), None)
    tokens = g.u[0] * g.progress[0]
    assert np.all(np.diff(tokens) >= -1e-12)
    assert tokens[3] == pytest.approx((raw[2] + raw[3]) / 2)  # pooled, not lifted
    assert p.ms_per_token(num_requests=1, fill_rows=4, depth=3) == pytest.approx(
        float(c.step_ms(np.array([4]), 3)[0]) / (
            1 + p.tokens.factors([3])[0] * ((raw[2] + raw[3]) / 2 - 1)))
