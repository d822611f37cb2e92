"""benchmarks/policy_ab.py: variants parse as written, the step accounting adds up, and planner
variants served side by side agree token for token."""

import argparse
import json
import os
import re
import sys
import types

import numpy as np
import pytest

from benchmark_scripts import ROOT, load_benchmark


@pytest.fixture(scope="module")
def bench():
    folder = os.path.join(ROOT, "benchmarks")
    sys.path.insert(0, folder)  # as for the script: it imports its step accounting from there
    try:
        yield load_benchmark("policy_ab", register=True)  # planner_cpu_time imports it
    finally:
        sys.modules.pop("policy_ab", None)
        sys.path.remove(folder)


def test_variants_parse_labels_options_and_a_forced_depth(bench):
    v = bench.parse_variant("nocal=dynamic:5,calibrate=false,explore_fraction=0.01")
    assert (v.label, v.policy, v.depth) == ("nocal", "dynamic", 5)
    assert v.options == {"calibrate": False, "explore_fraction": 0.01}
    assert v.force_depth is None
    v = bench.parse_variant("dynamic,force_depth=2,stat_half_life=none")
    assert (v.label, v.depth, v.force_depth) == ("dynamic,force_depth=2,stat_half_life=none", 7, 2)
    assert v.options == {"stat_half_life": None}
    assert bench.parse_variant("none").depth == 0
    assert bench.parse_variant("dynamic:7").catch_up
    assert not bench.parse_variant("commit=dynamic:7,catch_up=false").catch_up
    assert bench.parse_variant("dynamic:7").floor_timed is None
    assert bench.parse_variant("every=dynamic:7,floor_timed=1").floor_timed == 1
    assert bench.parse_variant("r=dynamic:7,replay_plans=true").replay_plans
    assert not bench.parse_variant("dynamic:7").replay_plans
    assert bench.parse_variant("b=dynamic:7,replay_plans=true,planner_busy=true").planner_busy
    assert bench.parse_variant("s=dynamic:7,replay_plans=true,plans_from=r").plans_from == "r"
    assert bench.parse_variant("dynamic:7").admission_interval == 1
    for text in ("a=none,admission_interval=4", "b=static:2,admission_interval=4"):
        assert bench.parse_variant(text).admission_interval == 4, text  # any policy
    assert bench.parse_variant("dynamic:7").prefill == "midpoints"
    assert bench.parse_variant("p=none,prefill=pow2").prefill == "pow2"  # any policy
    assert not bench.parse_variant("p=dynamic:7,prefill=pow2").tuned  # its planner's own
    for bad in ("static:3,calibrate=false", "dynamic:7,calibrate", "dynamic:7,x=abc",
                "dynamc:7", "static:3,catch_up=false", "dynamic:7,floor_timed=0",
                "static:3,floor_timed=2", "static:3,replay_plans=true",
                "dynamic:7,planner_busy=true", "dynamic:7,plans_from=r",
                "none,admission_interval=0", "none,prefill=pow3"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_variant(bad)


def test_a_variant_starts_from_a_cost_table_file_or_a_fresh_sweep(bench, tmp_path):
    path = tmp_path / "costs.json"
    path.write_text("{}")
    assert bench.parse_variant(f"old=dynamic:3,cost_table={path}").cost_table == str(path)
    assert bench.parse_variant("fresh=dynamic:3,cost_table=sweep").cost_table == "sweep"
    assert bench.parse_variant("dynamic:3").cost_table is None
    for bad in (f"dynamic:3,cost_table={tmp_path / 'missing.json'}", f"static:3,cost_table={path}"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_variant(bad)


def test_a_tuned_variant_keeps_its_refreshed_tables_out_of_the_shared_cache(bench, tmp_path):
    # Only the engine's own planner refreshes the cache that default engines load.
    assert not bench.parse_variant("dynamic:7").tuned
    assert not bench.parse_variant("r=dynamic:7,replay_plans=true").tuned
    for text in ("a=dynamic:7,calibrate=false", "b=dynamic:7,planner_at=HEAD",
                 "c=dynamic:7,force_depth=2", "d=dynamic:7,catch_up=false",
                 "e=dynamic:7,floor_timed=1", "f=dynamic:7,admission_interval=4"):
        assert bench.parse_variant(text).tuned, text
    cached = tmp_path / "cache" / "key.json"
    store = types.SimpleNamespace(path=str(cached))
    engine = types.SimpleNamespace(planning=types.SimpleNamespace(
        feedback=types.SimpleNamespace(cost_store=store)))
    bench.keep_tables_apart(engine)
    assert "policy_ab_costs_" in store.path and store.path != str(cached)
    bench.keep_tables_apart(types.SimpleNamespace(planning=types.SimpleNamespace(feedback=None)))


def test_cost_table_variants_serve_alike_and_leave_the_file_as_it_was(bench, capsys, tmp_path,
                                                                       monkeypatch):
    # One variant starts from a table file (a copy, which takes its refresh), another from a
    # fresh sweep; both serve greedy tokens equal to the reference's, as does one that admits
    # requests once every 3 steps with prompt chunks at powers of two alone.
    from lightspec_jax.planner import CostTable
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"target": CostTable({2: 1.0, 4: 1.2, 8: 1.6}).to_json(),
                                "draft": CostTable({2: 0.1, 4: 0.1, 8: 0.1}).to_json()}))
    before = path.read_bytes()
    built, build = {}, bench.build
    monkeypatch.setattr(bench, "build", lambda variant, *a, **k: built.setdefault(
        variant.label, build(variant, *a, **k)))
    code = bench.main(["--workload", "math", "--concurrency", "2", "--num-prompts", "3",
                       "--max-tokens", "6", "--repeats", "1", "static:2",
                       f"old=dynamic:3,cost_table={path}", "fresh=dynamic:3,cost_table=sweep",
                       "a3=static:2,admission_interval=3,prefill=pow2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert built["a3"].scheduler.admission_interval == 3
    assert built["static:2"].scheduler.admission_interval == 1
    rows = built["static:2"].runner.prefill_registry.sizes  # the benchmark's: with midpoints
    assert any(b & (b - 1) for b in rows[:-1]), rows
    assert built["a3"].runner.prefill_registry.sizes == tuple(
        b for b in rows if b & (b - 1) == 0 or b == rows[-1])
    assert "every variant's output equals static:2's" in out
    assert path.read_bytes() == before
    loaded = [line for line in out.splitlines() if "cost tables from" in line]
    assert loaded and all("policy_ab_costs_" in line for line in loaded), out


def _steps(rows):
    """(read time s, StepRecord-like, plan-like) from (period ms, prompt rows, verify rows,
    requests, emitted, next draft depth) rows; the first row only starts the clock."""
    t, out = 0.0, []
    for period, prompt, verify, n, emitted, depth in rows:
        t += period / 1e3
        record = types.SimpleNamespace(prefill_rows=prompt, verify_rows=verify, num_requests=n,
                                       emitted=emitted, draft_depth=depth, plan_ms=0.5,
                                       host_ms=1.0)
        plan = types.SimpleNamespace(draft_depth=depth, num_requests=n, fill_rows=verify,
                                     full_rows=verify + (emitted % 2))
        out.append((t, record, plan))
    return out


def test_step_time_is_split_by_kind_and_the_period_fit_recovers_its_costs(bench):
    rng = np.random.default_rng(0)
    rows, last_draft = [(5.0, 0, 8, 4, 4, 1)], 4
    for i in range(80):
        prompt = int(rng.integers(16, 128)) if i % 3 == 0 else 0
        n = 4 if i % 5 else 2
        verify, depth = int(rng.integers(n, 4 * n)), int(rng.integers(1, 4))
        # the true costs: 2 ms, 0.1 per prompt row, 0.3 per verify row beside a prompt chunk
        # and 0.2 without, 0.05 per draft row drafted before the step
        per_row = 0.3 if prompt else 0.2
        period = 2.0 + 0.1 * prompt + per_row * verify + 0.05 * last_draft
        rows.append((period, prompt, verify, n, verify // 2, depth))
        last_draft = depth * n
    steps = _steps(rows)
    s = bench.summarize([steps], concurrency=4)
    assert set(s["kinds"]) == {"prefill", "full", "tail"}
    assert sum(k[0] for k in s["kinds"].values()) == 80  # the first read starts the clock
    assert sum(k[1] for k in s["kinds"].values()) == pytest.approx(sum(r[0] for r in rows[1:]))
    assert s["kinds"]["tail"][0] == sum(1 for r in rows[1:] if r[1] == 0 and r[3] == 2)
    decode_rows = [r for r in rows if r[1] == 0]  # every read counts here, the first too
    assert s["trimmed"] == pytest.approx(sum(r[4] % 2 for r in decode_rows) / len(decode_rows))
    decode, prefill = bench.period_fit([steps])
    assert "0.2000 x verify rows" in decode and "0.0500 x draft rows" in decode
    assert "0.1000 x prompt rows" in prefill and "0.3000 x verify rows" in prefill


def test_full_steps_are_timed_by_the_plan_that_ran_them(bench):
    """plan_periods: each full decode-only step's period under (depth drafted before it,
    depth verified, depth drafted), "floor" when all are 0; steps with a prompt chunk, after
    one, or with under 3/4 of the concurrency decoding are left out."""
    t, steps = 0.0, []
    # (period ms, prompt rows, requests, depth verified, depth drafted, tokens emitted)
    script = ([(9.0, 0, 4, 0, 0, 4)] * 5 + [(12.0, 0, 4, 0, 2, 4)] + [(20.0, 0, 4, 2, 2, 10)] * 3
              + [(30.0, 64, 4, 2, 2, 10), (25.0, 0, 4, 2, 2, 10), (7.0, 0, 2, 2, 0, 5)])
    for period, prompt, n, verified, drafts, emitted in script:
        t += period / 1e3
        record = types.SimpleNamespace(prefill_rows=prompt, num_requests=n, emitted=emitted)
        plan = types.SimpleNamespace(verified_depth=verified, draft_depth=drafts)
        steps.append((t, record, plan))
    # The first step starts the clock; the step with a prompt chunk, the one after it and the
    # tail step (2 of 4 decoding) are no samples. Cells come most-sampled first.
    assert bench.plan_periods([steps], concurrency=4) == [
        "floor: 4 steps, period 9.00 ms (median 9.00), 0.44 tok/ms",
        "drafted 2 verified 2 drafts 2: 3 steps, period 20.00 ms (median 20.00), 0.50 tok/ms",
        "drafted 0 verified 0 drafts 2: 1 steps, period 12.00 ms (median 12.00), 0.33 tok/ms"]


def test_decode_steps_are_broken_down_by_the_requests_they_decoded(bench):
    """by_batch_size: each decode-only step after a decode-only read-back falls in the band
    of its request count (powers of two; the full concurrency apart), with its period, tokens
    and the depth it verified; prompt-chunk steps, the step after one and empty steps are
    left out."""
    t, steps = 0.0, []
    # (period ms, prompt rows, requests, depth verified, tokens emitted)
    script = [(5.0, 0, 8, 0, 8), (10.0, 0, 8, 0, 8), (12.0, 0, 8, 2, 20), (30.0, 64, 6, 0, 6),
              (9.0, 0, 6, 0, 6), (8.0, 0, 6, 1, 10), (4.0, 0, 5, 1, 8), (3.0, 0, 3, 0, 3),
              (2.0, 0, 1, 3, 4), (1.0, 0, 0, 0, 0)]
    for period, prompt, n, verified, emitted in script:
        t += period / 1e3
        record = types.SimpleNamespace(prefill_rows=prompt, num_requests=n, emitted=emitted)
        plan = types.SimpleNamespace(verified_depth=verified)
        steps.append((t, record, plan))
    # The first step starts the clock; the prompt-chunk step (30 ms) and the one after it
    # (9 ms) are no samples, nor is the empty last step.
    assert bench.by_batch_size([steps], concurrency=8) == [
        "N 1: 1 steps, 2.00 ms a step, 4.0 tok a step, 2.00 tok/ms, verified depths {3: 1}",
        "N 2-3: 1 steps, 3.00 ms a step, 3.0 tok a step, 1.00 tok/ms, verified depths {0: 1}",
        "N 4-7: 2 steps, 6.00 ms a step, 9.0 tok a step, 1.50 tok/ms, verified depths {1: 2}",
        "N 8: 2 steps, 11.00 ms a step, 14.0 tok a step, 1.27 tok/ms, verified depths "
        "{0: 1, 2: 1}"]


def test_common_prices_take_the_machine_speed_out_of_a_comparison(bench):
    """common_prices: two variants drafting alike but run while the machine ran at different
    speeds price alike; one that commits its tokens in more, cheaper steps prices by what
    those steps cost in the run, whatever its own periods were."""
    def repeat(cells, speed):
        # (verify bucket, depth drafted) per step; each request emits the depth drafted
        # before the step + 1; a step costs 4 ms, 0.5 a verify row and 1 a draft before it
        t, steps, last = 0.0, [], types.SimpleNamespace(draft_depth=0)
        record = types.SimpleNamespace(prefill_rows=0, num_requests=4, emitted=4)
        steps.append((t, record, last))
        for bucket, depth in cells:
            t += speed * (4.0 + 0.5 * bucket + 1.0 * last.draft_depth) / 1e3
            plan = types.SimpleNamespace(draft_depth=depth)
            record = types.SimpleNamespace(prefill_rows=0, num_requests=4, verify_rows=bucket,
                                           emitted=4 * (1 + last.draft_depth))
            steps.append((t, record, plan))
            last = plan
        return steps

    deep = [(12, 2)] * 10  # 4 requests: 3 tokens each a step, 12 ms a step
    shallow = [(8, 1)] * 15  # 2 tokens each, 9 ms a step
    runs = {"fast": [repeat(deep, 1.0)], "slow": [repeat(deep, 1.5)],
            "shallow": [repeat(shallow, 1.0), repeat(shallow, 1.5)]}
    priced = bench.common_prices(runs, concurrency=4)
    (n_fast, ms_fast, tok_fast, own_fast), (_, ms_slow, _, own_slow) = (
        priced["fast"], priced["slow"])
    assert (n_fast, tok_fast) == (10, 4 + 9 * 12)  # the first step verified no draft
    assert ms_fast == ms_slow and own_slow == pytest.approx(1.5 * own_fast)
    _, ms, tokens, _ = priced["shallow"]
    assert ms / tokens > ms_fast / tok_fast


def test_planner_variants_agree_token_for_token(bench, capsys):
    code = bench.main(["--workload", "math", "--concurrency", "2", "--num-prompts", "3",
                       "--max-tokens", "6", "--repeats", "2", "static:2", "none",
                       "d1=dynamic:3,force_depth=1,calibrate=false"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "every variant's output equals static:2's" in out
    assert "depths {1:" in out.split("d1 ")[1]  # the forced depth is what it drafted
    # Each variant against the best of the others, never itself, with its interval.
    against = out.split("each variant over the best other one")[1].splitlines()[1:4]
    means = {label: float(re.search(rf"^\s*{re.escape(label)}\s+([0-9.]+) \[", out,
                                    re.M).group(1)) for label in ("static:2", "none", "d1")}
    for line in against:
        label, ratio, best = re.match(r"\s*(\S+) x([0-9.]+) (\S+) \(median", line).groups()
        assert best != label and means[best] == max(m for k, m in means.items() if k != label)
        assert abs(float(ratio) - means[label] / means[best]) < 2e-3
        lo, hi = map(float, re.search(r"95% ([0-9.]+)-([0-9.]+)\)", line).groups())
        assert lo <= hi


def test_replayed_plans_count_the_batches_they_do_not_fit(bench):
    plans = [("p0", 2, np.array([5, 3])), ("p1", 1, np.array([2]))]
    script = bench.ReplayedPlans(plans)
    assert script.plan(num_requests=2, remaining=np.array([5, 3])) == "p0"
    assert script.plan(num_requests=1, remaining=np.array([3])) == "p1"  # not its batch
    assert script.mismatches == 1
    with pytest.raises(RuntimeError, match="ran out of plans"):
        script.plan(num_requests=1, remaining=np.array([1]))
    script.rewind()
    assert script.plan(num_requests=2, remaining=np.array([5, 3])) == "p0"


def test_a_replayed_pass_meets_its_batches_and_serves_the_same_tokens(bench, capsys):
    # Greedy serving is deterministic: the live planner's pass, replayed, meets the same
    # batches in every repeat (main() exits 1 otherwise), with the planner idle or busy, and
    # in another engine (plans_from), which then runs the very same steps.
    code = bench.main(["--workload", "math", "--concurrency", "2", "--num-prompts", "3",
                       "--max-tokens", "6", "--repeats", "2", "dynamic:3",
                       "replayed=dynamic:3,replay_plans=true",
                       "busy=dynamic:3,replay_plans=true,planner_busy=true",
                       "shared=dynamic:3,replay_plans=true,planner_busy=true,"
                       "plans_from=replayed"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "every variant's output equals dynamic:3's" in out
    replayed, busy = out.split("replayed ")[1], out.split("busy ")[1]
    assert "depths {" in replayed and "depths {" in busy
    depths = {label: out.split(f"{label} ")[1].split("depths ")[1].split("}")[0]
              for label in ("replayed", "shared")}
    assert depths["shared"] == depths["replayed"], out
    # the planning variants share prices; the one replayed idle has no partner
    priced = out.split("dynamic variants' full decode steps at their common prices")[1]
    assert [line.split()[0] for line in priced.splitlines()[1:4]] == [
        "dynamic:3", "busy", "shared"], out
    assert "idle variants" not in out
    with pytest.raises(SystemExit, match="names no earlier variant"):
        bench.main(["--workload", "math", "--concurrency", "2", "--num-prompts", "3",
                    "--max-tokens", "6", "--repeats", "1",
                    "early=dynamic:3,replay_plans=true,plans_from=late",
                    "late=dynamic:3,replay_plans=true"])


def test_planner_cpu_time_times_every_planner_call_of_each_variant(bench, capsys):
    cpu_time = load_benchmark("planner_cpu_time")  # imports policy_ab: the fixture's module
    build = bench.build
    code = cpu_time.main(["--workload", "math", "--concurrency", "2", "--num-prompts", "3",
                          "--max-tokens", "6", "--repeats", "1", "static:2", "dynamic:3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert bench.build is build  # put back
    table = out.split("planner calls, us per call: wall / thread CPU")[1]
    for label in ("static:2 plan", "static:2 observe", "dynamic:3 plan", "dynamic:3 observe"):
        row = re.search(rf"{label}\s+(\d+) calls\s+(\d+) /\s+(\d+)", table)
        assert row and int(row.group(1)) > 0, (label, table)


def test_the_ratio_interval_is_paired_by_repeat_and_narrows_with_repeats(bench):
    rng = np.random.default_rng(3)
    # The machine's speed moves both variants of a repeat alike: paired, the interval sees
    # only the variant's own spread around its true ratio (0.9), however far the speed moves
    # (resampled unpaired, the speeds' 0.6-1.4 spread alone would make it ~0.4 wide).
    speed = rng.uniform(0.6, 1.4, size=200)
    reference = 1000.0 * speed
    variant = 900.0 * speed * rng.normal(1.0, 0.05, size=200)
    for n in (8, 200):
        mid, lo, hi = bench.ratio_interval(variant[:n], reference[:n])
        of_means = variant[:n].mean() / reference[:n].mean()
        assert lo < of_means < hi and lo < mid < hi
        assert abs(mid - 0.9) < 0.05 and abs(of_means - 0.9) < 0.05
    wide = bench.ratio_interval(variant[:8], reference[:8])
    assert wide[2] - wide[1] < 0.1
    assert hi - lo < (wide[2] - wide[1]) / 2  # 25x the repeats: a narrower interval
    assert hi - lo > 0.005 and lo < 0.9 < hi
    # Identical readings: no spread at all.
    assert bench.ratio_interval(reference[:5], reference[:5]) == (1.0, 1.0, 1.0)
