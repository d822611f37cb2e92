"""CostTable: ceiling lookup, extrapolation, online EMA refresh, context axis, persistence."""

import json
import math

import numpy as np

import pytest

from lightspec_jax.planner import CostTable, PlannerSpec
from lightspec_jax.planner.costs import snap_context
from lightspec_jax.planner.objective import StepCosts


def test_lookup_rounds_up_to_next_key_and_extrapolates_above():
    # lightspec-algorithm.md §13.7: T={4:1, 8:3} -> estimate(7) = 3.0 (ceiling, no interpolation)
    table = CostTable({4: 1.0, 8: 3.0})
    assert table.estimate(4) == 1.0
    assert table.estimate(1) == 1.0
    assert table.estimate(5) == 3.0
    assert table.estimate(7) == 3.0
    assert table.estimate(8) == 3.0
    assert table.estimate(16) == pytest.approx(6.0)  # cost_max * b / b_max
    assert table.estimate(12) == pytest.approx(4.5)


def test_estimate_many_matches_estimate():
    table = CostTable({2: 1.0, 4: 1.5, 8: 2.5})
    rows = [1, 3, 8, 9, 20]
    assert table.estimate_many(rows).tolist() == [table.estimate(r) for r in rows]


def test_empty_table_is_reported_and_refuses_estimates():
    table = CostTable()
    assert table.is_empty
    with pytest.raises(ValueError, match="empty"):
        table.estimate(4)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_non_positive_or_non_finite_costs_are_rejected(bad):
    with pytest.raises(ValueError, match="finite"):
        CostTable({4: bad})
    table = CostTable({4: 1.0})
    with pytest.raises(ValueError, match="finite"):
        table.update(4, bad)


def test_update_is_an_ema_on_the_bucket_that_holds_the_rows():
    table = CostTable({4: 1.0, 8: 2.0}, decay=0.9)
    table.update(8, 4.0)
    assert table.estimate(8) == pytest.approx(0.9 * 2.0 + 0.1 * 4.0)
    # 6 rows run padded to the 8-row bucket, so the sample refreshes key 8.
    table.update(6, 4.0)
    assert table.estimate(8) == pytest.approx(0.9 * 2.2 + 0.1 * 4.0)
    assert table.estimate(4) == 1.0
    assert table.count(8) == 3


def test_update_above_the_largest_key_adds_a_key_and_first_sample_replaces():
    table = CostTable({4: 1.0})
    table.update(16, 5.0)
    assert table.rows == (4, 16)
    assert table.estimate(16) == 5.0
    assert table.estimate(10) == 5.0
    empty = CostTable()
    empty.update(3, 2.0)
    assert empty.estimate(3) == 2.0 and empty.estimate(6) == pytest.approx(4.0)


def test_update_level_moves_the_whole_column_and_keeps_its_shape():
    # A draft stage keyed by depth ("scale"): a depth-5 sample moves every depth by the factor
    # the EMA moves depth 5 by, so what depth 7 costs over depth 3 stays the sweep's ratio,
    # however the single steps scatter. The sampled cell alone counts the sample.
    sweep = {1: 0.3, 3: 0.9, 5: 1.5, 7: 2.1}
    table = CostTable(sweep, decay=0.9, impute="scale")
    for ms in (3.0, 1.0, 2.5):
        before = table.estimate(5)
        table.update_level(5, ms)
        assert table.estimate(5) == pytest.approx(0.9 * before + 0.1 * ms)
    factor = table.estimate(5) / 1.5
    for depth, ms in sweep.items():
        assert table.estimate(depth) == pytest.approx(ms * factor)
    assert table.count(5) == 4 and table.count(7) == 1
    # So does a table whose columns impute by a shift: the level is a factor within a column.
    rows = CostTable({4: 1.0, 8: 2.0}, decay=0.5)
    rows.update_level(4, 2.0)
    assert rows.estimate(4) == pytest.approx(1.5) and rows.estimate(8) == pytest.approx(3.0)
    # Cell by cell (update), a sample moves its own cell: the sweep's shape is gone.
    cells = CostTable(sweep, decay=0.9, impute="scale")
    cells.update(5, 3.0)
    assert cells.estimate(7) == 2.1 and cells.estimate(5) > 1.5


def test_update_level_starts_a_new_column_from_the_estimate_at_its_context():
    # A context the table has no column for: its first sample sets its cell, and its other
    # keys take the imputed values (attention's cost, common to every row count, shifts them;
    # a shift that would leave a cell at or below zero scales it instead). Later samples
    # move the column as one; the other columns stay.
    table = CostTable({4: 1.0, 8: 2.0}, context_len=0, impute="shift")
    table.update_level(8, 5.0, context_len=4096)
    assert table.estimate(8, 4096) == pytest.approx(5.0)
    assert table.estimate(4, 4096) == pytest.approx(4.0)
    assert table.estimate(8, 0) == 2.0 and table.count(4, 4096) == 0
    table.update_level(4, 6.0, context_len=4096)
    assert table.estimate(4, 4096) == pytest.approx(4.2)
    assert table.estimate(8, 4096) == pytest.approx(5.0 * 4.2 / 4.0)
    table.update_level(8, 0.5, context_len=8192)
    assert table.estimate(8, 8192) == pytest.approx(0.5)
    assert table.estimate(4, 8192) == pytest.approx(4.2 * 0.5 / 5.25)
    # Beyond the largest key a sample adds the key, as update() does.
    table.update_level(16, 9.0, context_len=4096)
    assert table.rows == (4, 8, 16) and table.estimate(16, 4096) == pytest.approx(9.0)


def test_context_free_table_ignores_context():
    table = CostTable({4: 1.0})
    table.update(4, 3.0, context_len=100_000)
    assert table.estimate(4, context_len=0) == table.estimate(4, context_len=10**6)
    assert not table.has_context_axis


def test_context_axis_learns_cost_growth_and_imputes_unmeasured_buckets():
    # Profiled at context 0 (LightLLM's 2-token dummies); then the 8-row bucket is measured at a
    # long context. Attention adds a row-independent cost, so the 4-row bucket at that context
    # is imputed with the same shift instead of keeping its start-up value.
    table = CostTable({4: 1.0, 8: 2.0}, context_len=0)
    assert table.has_context_axis
    ctx = 4096
    table.update(8, 5.0, context_len=ctx)
    assert table.estimate(8, ctx) == pytest.approx(5.0)
    assert table.estimate(4, ctx) == pytest.approx(1.0 + 3.0)
    assert table.estimate(8) == 2.0  # no context: the reference (profiled) column
    assert table.estimate(8, 0) == 2.0
    # Between columns the estimate is linear in context; beyond the last it is flat.
    assert table.estimate(8, ctx / 2) == pytest.approx(3.5)
    assert table.estimate(8, 10 * ctx) == pytest.approx(5.0)


def test_shift_imputation_never_prices_a_bucket_near_zero():
    # A measured cell far below the profiled one (a short context on a noisy host) gives a
    # shift larger than a smaller bucket's whole cost. Shifting would price that bucket at ~0,
    # and a refreshed step time split in proportion to the estimates would then keep it there;
    # such cells scale by the measured ratio instead.
    table = CostTable({16: 0.74, 64: 3.0}, context_len=128)
    table.update(64, 0.6, context_len=32)
    assert table.estimate(16, 32) == pytest.approx(0.74 * 0.6 / 3.0)
    # Where the shift stays positive it is still the model.
    table = CostTable({16: 2.0, 64: 3.0}, context_len=128)
    table.update(64, 2.5, context_len=32)
    assert table.estimate(16, 32) == pytest.approx(1.5)


def test_context_columns_snap_to_a_quarter_doubling_grid():
    assert snap_context(0) == 0
    for c in [1, 3, 100, 777, 4096, 123_457, 10**7]:
        snapped = snap_context(c)
        assert abs(math.log2(snapped) - math.log2(c)) <= 1 / 8 + 1e-9 or c < 4
    with pytest.raises(ValueError):
        snap_context(-1)


def test_save_load_round_trip(tmp_path):
    table = CostTable({2: 1.0, 8: 3.0}, context_len=0, decay=0.8)
    table.update(8, 6.0, context_len=2048)
    table.update(2, 1.5, context_len=2048)
    path = tmp_path / "costs.json"
    table.save(path)
    loaded = CostTable.load(path)
    assert loaded.to_json() == table.to_json()
    for rows in (1, 2, 5, 8, 40):
        for ctx in (None, 0, 1000, 2048, 9999):
            assert loaded.estimate(rows, ctx) == table.estimate(rows, ctx)
    flat = CostTable({4: 1.25})
    flat.save(path)
    assert CostTable.load(path).estimate(3) == 1.25


def test_plain_mapping_file_loads_and_garbage_is_rejected(tmp_path):
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({"1": 7.5, "16": 8.0}))
    assert CostTable.load(path).estimate(10) == 8.0
    path.write_text(json.dumps({"rows": "fast"}))
    with pytest.raises(ValueError, match="not a cost table"):
        CostTable.load(path)


def test_from_grid_builds_several_context_columns():
    table = CostTable.from_grid({0: {4: 1.0, 8: 2.0}, 1024: {4: 2.0, 8: 3.0}})
    assert table.contexts == (0, 1024)
    assert table.estimate(8, 512) == pytest.approx(2.5)


def test_estimate_many_is_estimate_for_each_row_count_with_contexts():
    # estimate_many prices whole columns at once (plan() calls it every step); it must give
    # estimate()'s values exactly, imputed cells and extrapolation above the largest key included.
    rng = np.random.default_rng(5)
    for trial in range(50):
        rows = sorted({int(r) for r in rng.integers(1, 100, size=int(rng.integers(1, 8)))})
        table = CostTable({r: 0.1 + rng.random() * r for r in rows},
                          context_len=None if trial % 5 == 0 else int(rng.integers(1, 4000)),
                          impute="scale" if trial % 3 == 0 else "shift")
        for _ in range(int(rng.integers(0, 25))):
            table.update(int(rng.integers(1, 140)), 0.01 + 5 * rng.random(),
                         float(rng.integers(0, 6000)))
            queries = rng.integers(1, 160, size=7)
            fresh = CostTable.from_json(table.to_json())  # nothing cached
            for context in (None, float(rng.integers(0, 8000))):
                want = [table.estimate(int(q), context) for q in queries]
                assert table.estimate_many(queries, context).tolist() == want
                # what the table keeps cached between updates is what a fresh one reads
                assert fresh.estimate_many(queries, context).tolist() == want
                # read_many, the planner's list path, reads the same values and counts
                assert table.read_many(tuple(queries.tolist()), context) == (
                    want, table.count_many(queries, context).tolist())


def test_scale_imputation_for_costs_that_grow_with_the_key():
    # A draft stage keyed by depth re-reads the context once per depth: at a longer context
    # every depth costs proportionally more, and an unmeasured depth follows by the ratio
    # (additively, depth 1's 0.02 ms would take depth 4's whole increase).
    table = CostTable({1: 0.02, 2: 1.0, 4: 3.0}, context_len=1024, impute="scale")
    table.update(2, 1.5, context_len=4096)  # 1.5x at the longer context
    assert table.estimate(4, 4096) == pytest.approx(4.5)
    assert table.estimate(1, 4096) == pytest.approx(0.03)
    shifted = CostTable({1: 0.02, 2: 1.0, 4: 3.0}, context_len=1024)
    shifted.update(2, 1.5, context_len=4096)
    assert shifted.estimate(1, 4096) == pytest.approx(0.52)
    loaded = CostTable.from_json(json.loads(json.dumps(table.to_json())))
    assert loaded.impute == "scale" and loaded.estimate(4, 4096) == pytest.approx(4.5)
    with pytest.raises(ValueError, match="impute"):
        CostTable({1: 1.0}, impute="linear")


def test_more_rows_or_a_deeper_draft_are_never_priced_cheaper():
    """The online refresh can leave a rarely chosen cell priced above larger ones (one slow
    sample, never corrected because the planner stops choosing it); pricing pools such cells
    by their samples, so no step's cost falls with its rows or its depth."""
    spec = PlannerSpec(verify_buckets=(2, 4, 8), draft_depths=(1, 2, 3, 4), max_depth=4)
    stage = CostTable({1: 0.2, 2: 0.4, 3: 0.6, 4: 0.8})
    target = CostTable({2: 3.0, 4: 4.0, 8: 5.0})
    for _ in range(9):
        stage.update(4, 0.8)  # depth 4: 10 samples at 0.8
        target.update(8, 2.0)  # 8 rows: 10 samples drifting below 4 rows' price
    stage.update(3, 6.0)  # depth 3: 2 samples, one slow
    raw_stage, raw_rows = stage.estimate(3), target.estimate(8)
    assert raw_stage > stage.estimate(4) and raw_rows < target.estimate(4)
    costs = StepCosts.price(spec, target, CostTable({2: 0.5, 4: 0.5, 8: 0.5}),
                            num_requests=2, context_len=None, depth_costs=stage)
    ms = [costs.depth_ms(d) for d in (1, 2, 3, 4)]
    assert ms[:2] == pytest.approx([0.2, 0.4])  # in order already: untouched
    assert ms[2] == ms[3] == pytest.approx((2 * raw_stage + 10 * 0.8) / 12)  # pooled
    rows = [costs.target_by_bucket[b] for b in (2, 4, 8)]
    assert rows[0] == pytest.approx(3.0)
    assert rows[1] == rows[2] == pytest.approx((1 * 4.0 + 10 * raw_rows) / 11)


def test_one_cells_device_ms_is_the_grids():
    # The loop prices each period's step with device_ms (floats, every step); it must be
    # device_ms_grid's value exactly, with a measured stage, an autoregressive tail and a
    # parallel drafter's block forward.
    from lightspec_jax.planner import DrafterKind

    rng = np.random.default_rng(3)
    target = CostTable({b: 1.0 + rng.random() * b for b in (1, 2, 4, 8)})
    draft = CostTable({b: 0.1 + rng.random() for b in (1, 2, 4, 8, 16)})
    stage = CostTable({d: 0.2 * d + rng.random() for d in (1, 2, 3)})
    for kind, depth_costs in ((DrafterKind.AUTOREGRESSIVE, stage),
                              (DrafterKind.AUTOREGRESSIVE, None),
                              (DrafterKind.PARALLEL, None)):
        parallel = kind is DrafterKind.PARALLEL
        spec = PlannerSpec(verify_buckets=(1, 2, 4, 8), max_depth=3, drafter_kind=kind,
                           draft_depths=(3,) if parallel else (1, 2, 3),
                           block_size=4 if parallel else None,
                           block_lead=1 if parallel else None)
        costs = StepCosts.price(spec, target, draft, num_requests=2, context_len=None,
                                depth_costs=depth_costs)
        for bucket in (1, 2, 4, 8):
            for depth in range(4):
                grid = costs.device_ms_grid(np.array([bucket]), np.array([depth]))[0, 0]
                assert costs.device_ms(bucket, depth) == float(grid), (kind, bucket, depth)
    with pytest.raises(KeyError):
        costs.device_ms(3, 1)
