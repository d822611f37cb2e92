"""The closed-loop simulator: device-fill emulation, accounting, oracle bounds, CLI."""

import dataclasses
import json

import numpy as np
import pytest

from lightspec_jax.planner import PlannerSpec
from lightspec_jax.planner.sim import cli as simulate_cli
from lightspec_jax.planner.sim import simulate
from lightspec_jax.planner.sim.costmodel import (RooflineCostModel, TableCostModel, profile_host,
                                                 profile_tables)
from lightspec_jax.planner.sim.oracle import Oracle
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


def test_fill_never_verifies_past_a_request_end():
    conf = np.full((3, 4), 0.9)
    # remaining 1: the bonus is all it may emit; remaining 3: two drafts at most
    assert _fill(conf, np.ones(3, bool), 4, 12, np.array([1, 3, 9])).tolist() == [0, 2, 4]


@pytest.mark.parametrize("policy", ["static-3", "static-11", "dynamic", "dspark", "oracle",
                                    "informed", "informed-last", "informed-filter",
                                    "dynamic-draft-stop"])
def test_every_requested_token_is_produced_exactly_once_and_none_past_an_end(policy):
    config = SimConfig(profile="code", concurrency=8, policy=policy, num_requests=24)
    trace = []
    result = run(config, trace=trace)
    _, outputs, _, _ = simulate.requests_for(config)
    produced = sum(t["committed"] + t["admitted"] for t in trace)
    assert produced == outputs.sum()
    assert result.output_tokens <= produced
    assert result.wasted_tokens == 0
    for t in trace:
        assert t["n"] <= t["fill"] <= t["bucket"]
        assert t["fill"] == t["n"] + t["verified"].sum()
        assert (t["accept"] <= t["verified"] + 1).all()
        assert (t["verified"] <= t["remaining"] - 1).all()  # no row past the end
        assert t["committed"] == t["accept"].sum()  # so nothing accepted is dropped


def test_a_draft_loop_stops_where_no_request_survives_to_the_stop():
    conf = np.array([[0.9, 0.9, 0.5, 0.9],
                     [0.6, 0.5, 0.9, 0.9],
                     [0.9, 0.9, 0.9, 0.9]])  # survival: .9 .81 .405 .36 / .6 .3 .27 .24
    has = np.array([True, True, False])  # the third drafts nothing this time
    assert simulate.stopped_depth(conf, has, 4, 0.5) == 3  # .405 and .27: both below
    assert simulate.stopped_depth(conf, has, 4, 0.2) == 4  # nobody falls below: the depth
    assert simulate.stopped_depth(conf, has, 2, 0.5) == 2  # never past the planned depth
    assert simulate.stopped_depth(conf, has, 4, 0.0) == 4  # no stop
    assert simulate.stopped_depth(conf, np.zeros(3, bool), 4, 0.5) == 4


def test_a_stopped_draft_is_verified_no_deeper_and_saves_its_forwards():
    config = SimConfig(profile="chat", concurrency=1, policy="dynamic-draft-stop",
                       num_requests=32)
    trace = []
    run(config, trace=trace)
    stopped = [t for prev, t in zip(trace, trace[1:])
               if t["proposal_depth"] < prev["draft_depth"]]
    assert len(stopped) > len(trace) / 10  # chat's confidences fall below 0.4 often
    for prev, t in zip(trace, trace[1:]):
        assert t["proposal_depth"] <= prev["draft_depth"]
        assert (t["verified"] <= t["proposal_depth"]).all()
        assert (t["saved_ms"] > 0) == (t["proposal_depth"] < prev["draft_depth"])


def test_a_floor_step_leaves_no_proposal_for_the_next():
    # Verify rows priced at 1/100 of an H200's FLOPs: a draft row costs more than it commits.
    # The floor runs no drafter forward, so it is cheaper than any speculative step and the
    # dynamic planner takes it in most steps; a floor step leaves the next step no proposal.
    cost = RooflineCostModel(flops_per_ms=RooflineCostModel().flops_per_ms / 100)
    config = SimConfig(profile="chat", concurrency=16, policy="dynamic", num_requests=32,
                       host_cost=False)
    trace = []
    run(config, cost, trace=trace)
    floors = [i for i, t in enumerate(trace[:-1]) if t["draft_depth"] == 0]
    assert len(floors) > len(trace) / 2
    for i in floors:
        assert trace[i + 1]["m"] == 0 and trace[i + 1]["verified"].sum() == 0
    # Without the floor the same planner keeps a proposal and verifies none of it mostly.
    trace = []
    run(dataclasses.replace(config, policy="dynamic-no-floor"), cost, trace=trace)
    assert not any(t["draft_depth"] == 0 for t in trace)
    bare = [t for t in trace if t["m"] == t["n"] and t["verified"].sum() == 0]
    assert len(bare) > len(trace) / 2


@pytest.mark.parametrize("overlap", [True, False])
def test_host_bound_steps_cost_their_host_time(overlap):
    # host(N) = 200 ms dwarfs any device step: with overlap the wall is the host's, without it
    # device + host; the planner, told so, treats extra rows and depth as free.
    cost = RooflineCostModel(host_base_ms=200.0)
    config = SimConfig(profile="math", concurrency=4, policy="dynamic", num_requests=8,
                       overlap=overlap)
    trace = []
    result = run(config, cost, trace=trace)
    for t in trace:
        assert t["host_ms"] > t["device_ms"]
        expected = t["host_ms"] if overlap else t["host_ms"] + t["device_ms"]
        assert t["step_ms"] == pytest.approx(expected)
    assert result.host_bound_steps == result.steps
    if overlap:  # free rows: the planner drafts deep and verifies everything it drafted
        assert result.draft_depth_sum / result.steps > 8
    off_trace = []
    off = run(SimConfig(profile="math", concurrency=4, policy="dynamic", num_requests=8,
                        host_cost=False), cost, trace=off_trace)
    assert off.host_bound_steps == 0 and all(t["host_ms"] == 0 for t in off_trace)


@pytest.mark.parametrize("overlap", [True, False])
def test_oracle_step_is_at_least_as_good_as_any_policy_step(overlap):
    # By construction, per step: any policy that verifies bucket B after drafting depth d
    # commits at most min(B, N + sum(min(accepted, d))) tokens at that (d, B)'s wall time; the
    # oracle maximises tokens / ms over the same (d, B) on its first step (no rate yet).
    spec = PlannerSpec(verify_buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48), draft_depths=(1, 2,
                       3, 4, 5), max_depth=5, floor=True)
    cost = RooflineCostModel(host_base_ms=3.0, host_per_request_ms=0.5)
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 9))
        accepted = rng.integers(0, 6, n)
        context = float(rng.integers(0, 5000))
        depth, bucket, verified = Oracle(spec, cost, overlap=overlap).choose(accepted,
                                                                            context=context)

        def rate(d, b):
            device = (cost.target_ms(b, context, n) + cost.draft_ms(b, context, n)
                      + max(d - 1, 0) * cost.draft_ms(spec.bucket_for(n), context, n))
            host = cost.host_ms(n)
            ms = max(device, host) if overlap else device + host
            return min(b, n + int(np.minimum(accepted, d).sum())) / ms

        assert (verified <= np.minimum(accepted, depth)).all()
        best_policy = max(rate(d, b) for d in spec.choices for b in spec.verify_buckets
                          if b >= n)
        assert rate(depth, bucket) >= best_policy * (1 - 1e-12)
        assert n + verified.sum() == min(bucket, n + int(np.minimum(accepted, depth).sum()))


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
    assert loaded.host_ms(64) == 0.0  # a file without a host table: no host time
    TableCostModel(target=target, draft=draft, host=profile_host(model, range(1, 9))).save(path)
    assert TableCostModel.load(path).host_ms(4) == pytest.approx(model.host_ms(4))


def test_cli_help_and_a_small_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        simulate_cli.main(["--help"])
    assert exit_info.value.code == 0
    assert "--cost-table" in capsys.readouterr().out
    table = tmp_path / "tables.json"
    assert simulate_cli.main(["--write-cost-table", str(table)]) == 0
    out = tmp_path / "runs.json"
    assert simulate_cli.main(["--profiles", "math", "--concurrency", "2", "--requests", "6",
                          "--policies", "static-3", "dynamic", "--cost-table", str(table),
                          "--jobs", "1", "--json", str(out)]) == 0
    report = capsys.readouterr().out
    assert "### math" in report and "LightSpec dynamic" in report
    runs = json.loads(out.read_text())["runs"]
    assert {r["policy"] for r in runs} == {"static-3", "dynamic"}
    assert all(r["throughput"] > 0 for r in runs)


def test_seeds_pool_into_one_run_of_all_their_tokens_over_all_their_time():
    runs = [run(SimConfig(profile="chat", concurrency=4, policy="static-3", num_requests=12,
                          seed=seed)).summary() for seed in (3, 4)]
    both = simulate.pooled(runs)
    assert both["output_tokens"] == sum(r["output_tokens"] for r in runs)
    assert both["throughput"] == pytest.approx(
        1000.0 * both["output_tokens"] / sum(r["time_ms"] for r in runs))
    assert min(r["throughput"] for r in runs) <= both["throughput"] <= max(
        r["throughput"] for r in runs)
    assert both["extra"]["seeds"] == [3, 4]
    assert both["extra"]["seed_throughput"] == [r["throughput"] for r in runs]
    assert simulate.pooled(runs[:1]) == runs[0]
    other = run(SimConfig(profile="chat", concurrency=4, policy="static-11",
                          num_requests=12)).summary()
    with pytest.raises(ValueError, match="one .* cell"):
        simulate.pooled([runs[0], other])


def test_cli_pools_seeds_and_counts_those_where_dynamic_held(tmp_path, capsys):
    out = tmp_path / "runs.json"
    args = ["--profiles", "chat", "--concurrency", "2", "--requests", "6", "--jobs", "1",
            "--policies", "static-3", "static-11", "dynamic", "oracle"]
    assert simulate_cli.main(args + ["--seeds", "2", "--seed", "5", "--json", str(out)]) == 0
    report = capsys.readouterr().out
    assert "each cell 2 seeds pooled" in report and "seeds held" in report
    assert " of 2 |" in report
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 4 and all(r["extra"]["seeds"] == [5, 6] for r in runs)
    alone = tmp_path / "alone.json"
    assert simulate_cli.main(args + ["--seed", "6", "--json", str(alone)]) == 0
    assert "seeds held" not in capsys.readouterr().out
    single = {r["policy"]: r["throughput"] for r in json.loads(alone.read_text())["runs"]}
    assert {r["policy"]: r["extra"]["seed_throughput"][1] for r in runs} == single


def test_informed_oracle_verifies_the_likeliest_rows_up_to_each_end():
    from lightspec_jax.planner.sim.oracle import InformedOracle
    from lightspec_jax.planner.synthetic import AcceptanceModel

    model = AcceptanceModel.calibrated("code")  # the choice reads only the survival it is given
    spec = PlannerSpec(verify_buckets=(1, 2, 3, 4, 6, 8, 12, 16), draft_depths=(1, 2, 3, 4),
                       max_depth=4, floor=True)
    cost = RooflineCostModel()
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(1, 4))
        survival = np.cumprod(rng.uniform(0.2, 1.0, (n, 4)), axis=1)  # [N, K] non-increasing
        room = rng.integers(0, 5, n)  # drafts each may still use
        survival[np.arange(4)[None, :] >= room[:, None]] = 0.0
        depth, bucket, verified = InformedOracle(spec, cost, model=model).choose(
            survival, context=float(rng.integers(0, 4000)))
        assert (verified <= np.minimum(room, depth)).all()
        assert n + verified.sum() <= bucket
        # the verified rows are the most likely of the chosen depth's positions
        chosen = [survival[r, j] for r in range(n) for j in range(verified[r])]
        left = [survival[r, j] for r in range(n) for j in range(verified[r], depth)
                if survival[r, j] > 0]
        assert not chosen or not left or min(chosen) >= max(left)


def test_the_informed_oracle_lies_between_the_planners_and_the_oracle():
    # Without hindsight it verifies rows that fail, so it stays below the oracle; knowing
    # each request's acceptance probabilities, it runs ahead of a planner that learns them
    # (here, on the same draws).
    results = {p: run(SimConfig(profile="math", concurrency=4, policy=p, num_requests=40))
               for p in ("dynamic", "informed", "oracle")}
    assert results["informed"].wasted_tokens == 0
    assert results["informed"].acceptance_rate < 1.0 == results["oracle"].acceptance_rate
    assert (results["dynamic"].throughput < results["informed"].throughput
            < results["oracle"].throughput)


def test_the_drift_filter_learns_a_requests_drift_from_its_outcomes():
    # One request, every step verifying all K drafts: the filter's posterior mean follows the
    # drift it never sees (closer than the prior's spread), and a new request starts over.
    from lightspec_jax.planner.sim.oracle import DriftFilter
    from lightspec_jax.planner.synthetic import AcceptanceModel

    model = AcceptanceModel.calibrated("code")
    rng = np.random.default_rng(3)
    k, sigma = 7, model.profile.drift_sigma
    tracker = DriftFilter(model, slots=2)
    slot, quality, drift = np.array([1]), np.array([model.mu]), model.initial_drift(rng, 1)
    truth, means = [], []
    for _ in range(400):
        _, at = tracker.survival(slot, quality, k)
        drift, accepted, _ = model.step(rng, quality, drift, k)
        tracker.observe(slot, at, np.array([k]), accepted)
        truth.append(drift[0])
        means.append(tracker.posterior[1] @ tracker.z)
    truth, means = np.array(truth[50:]), np.array(means[50:])
    assert np.corrcoef(truth, means)[0, 1] > 0.5
    assert np.mean((truth - means) ** 2) < 0.8 * sigma ** 2  # the prior alone: sigma ** 2
    assert np.allclose(tracker.posterior[0], tracker.prior)  # the other slot saw nothing
    tracker.admit(slot)
    assert np.allclose(tracker.posterior[1], tracker.prior)
