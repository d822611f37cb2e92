"""benchmarks/planner_replay.py: a recording replays into a fresh planner, which must make the
recorded plans; one that differs fails the replay."""

import dataclasses
import pickle

import numpy as np
import pytest

from lightspec_jax.planner import CostTable, PlannerSpec, StepObservation

from benchmark_scripts import ROOT, load_benchmark


def _bench():
    return load_benchmark("planner_replay")


def _recording(bench):
    """A recording as `record` writes one, from a planner driven without an engine."""
    buckets = (1, 2, 4, 6, 8, 12, 16)
    built = {"kind": "dynamic",
             "spec": PlannerSpec(verify_buckets=buckets, draft_depths=(1, 2, 3), max_depth=3,
                                 floor=True),
             "kwargs": {"target_costs": CostTable({b: 1.0 + 0.2 * b for b in buckets}).to_json(),
                        "draft_costs": CostTable({b: 0.2 + 0.02 * b for b in buckets}).to_json(),
                        "replan_every": 4}}
    planner, rng, calls = bench._fresh_planner(built), np.random.default_rng(0), []
    for _ in range(60):
        n = int(rng.integers(1, 5))
        kw = dict(num_requests=n, remaining=rng.integers(1, 10, size=n))
        plan = planner.plan(**kw)
        calls.append(("plan", (), kw, plan))
        accept = np.minimum(rng.geometric(0.35, size=n), plan.verified_depth + 1)
        obs = StepObservation(plan=plan, accept_lens=accept, step_ms=1.0 + 0.1 * plan.verify_rows)
        planner.observe(obs)
        calls.append(("observe", (obs,), {}, None))
        planner.observe_host(num_requests=n, host_ms=0.3)
        calls.append(("observe_host", (), dict(num_requests=n, host_ms=0.3), None))
    return {"planner": built, "calls": calls}


def test_a_recording_replays_to_the_same_plans_and_a_changed_one_fails(tmp_path, capsys):
    bench = _bench()
    recording = _recording(bench)
    assert {c[3].reason for c in recording["calls"] if c[0] == "plan"} >= {"plan"}
    same = tmp_path / "same.pkl"
    same.write_bytes(pickle.dumps(recording))
    with pytest.raises(SystemExit) as done:
        bench.main(["replay", str(same), "--repeats", "2"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "60 plans" in out and "plans that differ: 0" in out

    i = next(i for i, c in enumerate(recording["calls"])
             if c[0] == "plan" and c[3].reason == "plan")
    name, a, kw, plan = recording["calls"][i]
    other = dataclasses.replace(plan, draft_depth=plan.draft_depth % 3 + 1)
    recording["calls"][i] = (name, a, kw, other)
    changed = tmp_path / "changed.pkl"
    changed.write_bytes(pickle.dumps(recording))
    with pytest.raises(SystemExit) as done:
        bench.main(["replay", str(changed), "--repeats", "1"])
    assert done.value.code == 1
    assert "plans that differ: 1" in capsys.readouterr().out


def test_predictions_may_move_in_their_last_bits_decisions_may_not():
    bench = _bench()
    plan = next(c[3] for c in _recording(bench)["calls"]
                if c[0] == "plan" and c[3].reason == "plan")
    assert bench._differs(plan, plan) is None
    nudged = dataclasses.replace(plan, predicted_ms=plan.predicted_ms * (1 + 1e-12))
    assert bench._differs(nudged, plan) is None
    moved = dataclasses.replace(plan, predicted_ms=plan.predicted_ms * (1 + 1e-6))
    assert bench._differs(moved, plan).startswith("predicted_ms")
    deeper = dataclasses.replace(plan, draft_depth=plan.draft_depth + 1)
    assert bench._differs(deeper, plan).startswith("draft_depth")


def test_against_a_revision_replays_its_planner_beside_todays(tmp_path, capsys):
    """--against HEAD: the committed planner, imported under another name, replays the same
    recording pass for pass with today's (both make its plans: the recording came from
    today's, which a clean checkout's HEAD is)."""
    import shutil
    import subprocess

    if shutil.which("git") is None or subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("needs a git checkout")
    if subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--", "planner/"],
                      capture_output=True).returncode:
        pytest.skip("planner/ has uncommitted changes: HEAD's planner is not today's")
    bench = _bench()
    path = tmp_path / "rec.pkl"
    path.write_bytes(pickle.dumps(_recording(bench)))
    with pytest.raises(SystemExit) as done:
        bench.main(["replay", str(path), "--repeats", "2", "--against", "HEAD"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.count("plans that differ: 0") == 2 and "today / HEAD:" in out
    with pytest.raises(SystemExit, match="no-such-revision"):
        bench.main(["replay", str(path), "--against", "no-such-revision"])


def test_cold_caches_write_between_calls_untimed_and_change_no_plan(tmp_path, capsys):
    """--cold-caches: the flush array is written once before every recorded call, and the
    planner makes the recorded plans all the same."""
    bench = _bench()
    recording = _recording(bench)
    flush = np.zeros(8)
    spent, mismatches, _, _ = bench._run(bench._fresh_planner(recording["planner"]),
                                         recording["calls"], flush)
    assert mismatches == 0 and set(spent) == {"plan", "observe", "observe_host"}
    assert (flush == len(recording["calls"])).all()
    path = tmp_path / "rec.pkl"
    path.write_bytes(pickle.dumps(recording))
    with pytest.raises(SystemExit) as done:
        bench.main(["replay", str(path), "--repeats", "1", "--cold-caches", "1"])
    assert done.value.code == 0
    assert "plans that differ: 0" in capsys.readouterr().out


def test_a_revision_whose_types_differ_only_in_comments_is_replayable():
    """--against needs the revision's planner/types.py to be today's code: comments and
    layout may differ, a field may not."""
    bench = _bench()
    today = "class A:\n    x: int  # rows\n"
    assert bench.same_code(today, "class A:\n\n    x: int  # rows, bucketed\n")
    assert not bench.same_code(today, "class A:\n    x: int\n    y: int\n")
