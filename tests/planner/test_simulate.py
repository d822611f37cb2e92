"""The closed-loop simulator: device-fill emulation, accounting, oracle bound, CLI."""

import json

import numpy as np
import pytest

from lightspec_jax.planner.sim import simulate
from lightspec_jax.planner.sim.costmodel import RooflineCostModel, TableCostModel, profile_tables
from lightspec_jax.planner.sim.simulate import SimConfig, _fill, run


def test_fill_takes_the_most_confident_prefixes():
    conf = np.array([[0.9, 0.9, 0.1], [0.5, 0.99, 0.99], [0.99, 0.99, 0.99]])
    has = np.array([True, True, False])
    # survivals: r0 .9 .81 .081; r1 .5 .495 .49; r2 has no proposal
    assert _fill(conf, has, 3, 2).tolist() == [2, 0, 0]
    assert _fill(conf, has, 3, 4).tolist() == [2, 2, 0]
    assert _fill(conf, has, 2, 10).tolist() == [2, 2, 0]
    assert _fill(conf, has, 3, 0).tolist() == [0, 0, 0]


def test_fill_breaks_ties_by_request_order():
    conf = np.full((3, 2), 0.5)
    assert _fill(conf, np.ones(3, bool), 2, 2).tolist() == [1, 1, 0]


@pytest.mark.parametrize("policy", ["static-3", "dynamic", "dspark", "oracle"])
def test_every_requested_token_is_produced_exactly_once(policy):
    config = SimConfig(profile="code", concurrency=8, policy=policy, num_requests=24)
    trace = []
    result = run(config, trace=trace)
    _, outputs, _, _ = simulate.requests_for(config)
    produced = sum(t["committed"] + t["admitted"] for t in trace)
    assert produced == outputs.sum()
    assert result.output_tokens <= produced
    for t in trace:
        assert t["n"] <= t["fill"] <= t["bucket"]
        assert t["fill"] == t["n"] + t["verified"].sum()
        assert (t["accept"] <= t["verified"] + 1).all()


def test_oracle_bounds_the_planners():
    for c in (4, 64):
        results = {p: run(SimConfig(profile="chat", concurrency=c, policy=p,
                                    num_requests=simulate.default_requests(c)))
                   for p in ("static-3", "static-11", "dynamic", "oracle")}
        best_other = max(r.throughput for p, r in results.items() if p != "oracle")
        assert results["oracle"].throughput > best_other
        assert results["oracle"].acceptance_rate == 1.0


def test_dynamic_verifies_far_fewer_rows_than_static_11_when_rows_cost_compute():
    config = dict(profile="chat", concurrency=64, num_requests=256)
    dynamic = run(SimConfig(policy="dynamic", **config))
    static = run(SimConfig(policy="static-11", **config))
    assert dynamic.throughput > 1.5 * static.throughput
    assert dynamic.rows_per_request_step < static.rows_per_request_step / 3


def test_roofline_profile_round_trips_through_a_table_file(tmp_path):
    model = RooflineCostModel()
    target, draft = profile_tables(model, (1, 2, 4, 8))
    path = tmp_path / "tables.json"
    TableCostModel(target=target, draft=draft).save(path)
    loaded = TableCostModel.load(path)
    for rows in (1, 3, 8):
        bucket = min(b for b in (1, 2, 4, 8) if b >= rows)
        assert loaded.target_ms(rows, 0, rows) == pytest.approx(model.target_ms(bucket, 0, 1))
        assert loaded.draft_ms(rows, 0, rows) == pytest.approx(model.draft_ms(bucket, 0, 1))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"target": {"1": 1.0}}))
    with pytest.raises(ValueError, match="draft"):
        TableCostModel.load(bad)


def test_cli_help_and_a_small_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        simulate.main(["--help"])
    assert exit_info.value.code == 0
    assert "--cost-table" in capsys.readouterr().out
    table = tmp_path / "tables.json"
    assert simulate.main(["--write-cost-table", str(table)]) == 0
    out = tmp_path / "runs.json"
    assert simulate.main(["--profiles", "math", "--concurrency", "2", "--requests", "6",
                          "--policies", "static-3", "dynamic", "--cost-table", str(table),
                          "--jobs", "1", "--json", str(out)]) == 0
    report = capsys.readouterr().out
    assert "### math" in report and "LightSpec dynamic" in report
    runs = json.loads(out.read_text())["runs"]
    assert {r["policy"] for r in runs} == {"static-3", "dynamic"}
    assert all(r["throughput"] > 0 for r in runs)
