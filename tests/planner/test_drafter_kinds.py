"""The planner with each drafter kind: an autoregressive drafter's depth costs a forward per
draft, a block drafter's one forward (the whole block, or one cut to the depth)."""

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, DrafterKind, PlannerSpec, draft_cost_ms
from test_lightspec import EAGLE_D, EAGLE_T, observe, planner, spec, warm


def test_parallel_drafter_keeps_its_block_depth():
    # §13.2 variant: a drafter that only offers depth K keeps d=K with the same inputs
    p = planner(spec(buckets=(2, 4, 8), kind="parallel"), EAGLE_T, EAGLE_D)
    warm(p)
    observe(p, p.plan(num_requests=2), [4, 4])
    plan = p.plan(num_requests=2)
    assert plan.draft_depth == 3 and plan.verify_rows == 4


def test_block_drafter_trims_the_verify_budget():
    # §13.3: DFlash K=block=7, T={2:1, 4:1.1, 8:3, 16:8}, D={14:0.5}, accept [3,3] at (2,16,7)
    s = spec(k=7, buckets=(2, 4, 8, 16), kind="parallel")
    p = planner(s, {2: 1.0, 4: 1.1, 8: 3.0, 16: 8.0}, {14: 0.5})
    warm(p)
    full = p.plan(num_requests=2)
    assert full.fill_rows == 16
    for _ in range(8):
        observe(p, full, [3, 3])
    plan = p.plan(num_requests=2)
    assert (plan.verify_rows, plan.draft_depth) == (4, 7)


def test_draft_cost_per_drafter_kind():
    # §13.6
    eagle = spec(k=3, buckets=(2, 4, 8))
    assert draft_cost_ms(eagle, CostTable({2: 0.25}), num_requests=2, verify_rows=8,
                         depth=3) == pytest.approx(1.5)
    eagle7 = spec(k=7, buckets=(8, 16))
    linear = CostTable({b: float(b) for b in range(1, 17)})
    assert draft_cost_ms(eagle7, linear, num_requests=8, verify_rows=16,
                         depth=7) == pytest.approx(64.0)
    dflash = PlannerSpec(verify_buckets=(16,), draft_depths=(7,), max_depth=7,
                         drafter_kind=DrafterKind.PARALLEL, block_size=7)
    assert draft_cost_ms(dflash, CostTable({8: 0.4}), num_requests=2, verify_rows=16,
                         depth=7) == pytest.approx(1.5)
    dspark = spec(k=3, buckets=(8,), kind="parallel")
    assert draft_cost_ms(dspark, CostTable({8: 0.8}), num_requests=4, verify_rows=8,
                         depth=3) == pytest.approx(2.0)
    # a block cut to the depth (block_lead 1, the bonus row): d + 1 rows per request
    cut = PlannerSpec(verify_buckets=(16,), draft_depths=(1, 2, 3, 7), max_depth=7,
                      drafter_kind=DrafterKind.PARALLEL, block_size=8, block_lead=1)
    assert [draft_cost_ms(cut, linear, num_requests=2, verify_rows=16, depth=d)
            for d in (1, 3, 7)] == pytest.approx([16 + 4, 16 + 8, 16 + 16])
    with pytest.raises(ValueError, match="depth"):
        draft_cost_ms(eagle, CostTable({2: 0.25}), num_requests=2, verify_rows=8, depth=0)


def test_a_cut_block_drafts_shallower_where_its_rows_cost():
    """A block drafter that cuts its block to the depth offers every depth, priced by its
    rows: with drafts that mostly survive and a block forward that costs by its rows, the
    planner drafts a short block (priced as the whole block, every depth would cost the
    same and the deepest would win); the same drafter running its whole block drafts all of
    it or nothing."""
    buckets = (4, 8, 12, 16, 20, 24, 28, 32)
    target = {b: 1.0 + 0.05 * b for b in buckets}
    draft = {r: 0.5 * r for r in range(1, 33)}

    def run(**block):
        s = PlannerSpec(verify_buckets=buckets, max_depth=7, drafter_kind=DrafterKind.PARALLEL,
                        block_size=8, **block)
        p = planner(s, target, draft)
        warm(p, n=4)
        for _ in range(30):
            plan = p.plan(num_requests=4)
            observe(p, plan, np.minimum([8, 6, 5, 7], plan.verified_depth + 1))  # bonus incl.
        return p.plan(num_requests=4).draft_depth

    assert 1 <= run(draft_depths=range(1, 8), block_lead=1) <= 4
    assert run(draft_depths=(7,)) in (0, 7)
