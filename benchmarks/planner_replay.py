"""The planner's host time, replayed: record every planner call of a real serving run, then
time the planner alone on those calls and check that it makes the same plans.

plan() and observe() run on the host every engine step, so their time is step time (on this
CPU the "device" computes on the same two cores, and inside a live step they run about twice
as slow as alone). Timing them inside the serving loop mixes them with the device's work;
replaying the recorded calls into a fresh planner times the planner alone, on real inputs
(batch shapes, request ends, acceptance, measured step times), and compares its plans with
the ones the run made - so a change meant to be a pure speed-up can show that it decides
exactly as before.

    # dynamic:7 on the shipped pair: warm-up, then two passes over the prompts
    python benchmarks/planner_replay.py record --workload humaneval --concurrency 1 \
        --num-prompts 32 --out he-c1.pkl
    # microseconds per step by call, best of --repeats; exits 1 if any plan differs
    python benchmarks/planner_replay.py replay he-c1.pkl [more.pkl ...] --repeats 10
    # the same, interleaved pass by pass with the planner of a git revision (this shared
    # machine's speed drifts by 10-20% between runs; passes side by side share the drift)
    python benchmarks/planner_replay.py replay he-c1.pkl --repeats 20 --against HEAD~3

Back to back, the planner's code and data stay in the caches; in a serving loop the device's
step runs between two calls (on this CPU, on the same cores; the shipped pair's weights
alone are tens of MiB) and evicts them. With `--cold-caches MIB` an array of MIB MiB is
written through before every call, untimed. Math c = 1 (Eagle3, 32 prompts), us a step for
plan() / observe(): hot 245 / 107, 16 MiB 415 / 217, 32 MiB 470 / 255, 64 MiB 615 / 399;
in the serving loop the same calls took 564 / 370 us of the thread's CPU time
(benchmarks/planner_cpu_time.py). A change to the planner's speed is best judged cold.

A recording holds the planner's construction (its spec, initial cost tables as JSON, options)
and the calls' arguments, not the planner object, so one recording replays on any later
version of the planner.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import copy
import dataclasses
import importlib
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

CALLS = ("plan", "observe", "observe_host", "observe_period")
TABLES = ("target_costs", "draft_costs", "depth_costs", "host_costs")


def record(args) -> None:
    import types

    import lightspec_jax.engine.planning as planning_module
    from lightspec_jax.bench.serve import build_engine
    from lightspec_jax.bench.workloads import load_workload, workload_requests
    from lightspec_jax.tokenizer import Tokenizer

    pair = args.pair.rstrip("/")
    tok = Tokenizer.from_file(f"{pair}/target/tokenizer.json")
    items = load_workload(args.workload, tok, args.num_prompts, seed=0, max_prompt_len=256)
    prompts, params = workload_requests(items, max_tokens=args.max_tokens)
    longest = max(map(len, prompts))
    built = {}
    make = planning_module.make_planner

    def capture(kind, spec, **kwargs):  # the engine's planner, as constructed
        built.update(kind=kind, spec=spec, kwargs={
            k: (v.to_json() if k in TABLES and v is not None else v) for k, v in kwargs.items()})
        return make(kind, spec, **kwargs)

    planning_module.make_planner = capture
    try:
        drafter = args.drafter if args.drafter == "ngram" else f"{pair}/{args.drafter}"
        engine = build_engine(types.SimpleNamespace(target=f"{pair}/target", drafter=drafter,
                                                    dtype="float32"),
                              policy="dynamic", depth=args.depth, concurrency=args.concurrency,
                              max_model_len=longest + args.max_tokens + 1,
                              longest_prompt=longest)
    finally:
        planning_module.make_planner = make
    calls = []
    planner = engine.planner
    for name in CALLS:
        method = getattr(planner, name)

        def logged(*a, _method=method, _name=name, **kw):
            result = _method(*a, **kw)
            calls.append((_name, copy.deepcopy(a), copy.deepcopy(kw), result))
            return result

        setattr(planner, name, logged)
    warm = min(args.concurrency, len(prompts))
    engine.generate(prompts[:warm], [dataclasses.replace(p, max_tokens=4) for p in params[:warm]])
    for _ in range(2):
        engine.generate(prompts, params)
    with open(args.out, "wb") as f:
        pickle.dump({"planner": built, "calls": calls}, f)
    steps = sum(name == "plan" for name, *_ in calls)
    print(f"recorded {len(calls)} planner calls ({steps} plans) to {args.out}")


def _fresh_planner(built, package=None):
    """The recording's planner, built by `package` (a planner package; default today's)."""
    if package is None:
        import lightspec_jax.planner as package

    kwargs = {k: (package.CostTable.from_json(v) if k in TABLES and v is not None else v)
              for k, v in built["kwargs"].items()}
    return package.make_planner(built["kind"], built["spec"], **kwargs)


def planner_at(revision: str):
    """The planner package (planner/*.py) as it was at a git revision, imported beside
    today's under another name. Its types are today's (the recordings hold today's
    PlannerSpec and StepObservation), so the revision's planner/types.py must equal today's
    but for its comments."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)

    names = git("ls-tree", "--name-only", revision, "planner/")
    if names.returncode:
        raise SystemExit(f"--against {revision}: {names.stderr.strip()}")
    with open(os.path.join(root, "planner", "types.py")) as f:
        today = f.read()
    if not same_code(git("show", f"{revision}:planner/types.py").stdout, today):
        raise SystemExit(f"--against {revision}: planner/types.py differs from today's, so "
                         "the recorded calls cannot be handed to that planner")
    name = "planner_at_" + re.sub(r"\W", "_", revision)
    folder = tempfile.mkdtemp(prefix="planner-replay-")
    atexit.register(shutil.rmtree, folder, True)
    os.makedirs(os.path.join(folder, name))
    for path in names.stdout.split():
        if path.endswith(".py"):
            text = git("show", f"{revision}:{path}").stdout
            if path == "planner/types.py":
                text = ("import lightspec_jax.planner.types as _today\n\n"
                        "globals().update({k: v for k, v in vars(_today).items()\n"
                        "                  if not k.startswith('__')})\n")
            with open(os.path.join(folder, name, os.path.basename(path)), "w") as f:
                f.write(text)
    sys.path.insert(0, folder)
    return importlib.import_module(name)


def same_code(a: str, b: str) -> bool:
    """Whether two Python sources differ in their comments and layout at most."""
    return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))


def make_planner_at(revision: str):
    """planner_at(revision).make_planner, for today's engine: the dynamic planner's options
    that the revision does not know (added since) are left out, so it plans as it did then."""
    package = planner_at(revision)
    known = {f.name for f in dataclasses.fields(package.LightSpecOptions)}
    named = {"target_costs", "draft_costs", "depth_costs", "host_costs", "overlap"}

    def make(kind, spec, **kwargs):
        if {"lightspec": "dynamic"}.get(kind, kind) == "dynamic":
            kwargs = {k: v for k, v in kwargs.items() if k in named or k in known}
        return package.make_planner(kind, spec, **kwargs)
    return make


def _differs(a, b) -> str | None:
    """The first field in which two StepPlans differ, or None: the decisions (rows, depths,
    reason) exactly, the predictions (floats) to 1e-9 relative, NaN equal to NaN - a speed-up
    may sum in another order and move a prediction's last bits, never a decision."""
    for field, x, y in zip(dataclasses.fields(a), dataclasses.astuple(a),
                           dataclasses.astuple(b)):
        if isinstance(x, float) and isinstance(y, float):
            if math.isnan(x) and math.isnan(y) or math.isclose(x, y, rel_tol=1e-9):
                continue
        elif x == y:
            continue
        return f"{field.name} {x!r} (recorded {y!r})"
    return None


def _decides_alike(a, b) -> bool:
    """Whether two StepPlans make the same decision (rows, depths, reason): every field but
    the predictions (floats)."""
    return all(x == y for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b))
               if not isinstance(x, float))


def _run(planner, calls, flush=None) -> tuple[dict[str, float], int, str]:
    """One pass over the recorded calls: (seconds by call, plans that differ, the first, and
    how many of them in a decision). flush: an array written through before every call,
    untimed (--cold-caches)."""
    spent: dict[str, float] = defaultdict(float)
    mismatches, first, plans, decisions = 0, "", 0, 0
    for name, a, kw, result in calls:
        if flush is not None:
            flush += 1.0
        method = getattr(planner, name)
        start = time.perf_counter()
        out = method(*a, **kw)
        spent[name] += time.perf_counter() - start
        if name == "plan":
            plans += 1
            why = _differs(out, result)
            if why is not None:
                mismatches += 1
                decisions += not _decides_alike(out, result)
                first = first or f" (the first, plan {plans}: {why})"
    return spent, mismatches, first, decisions


def replay(args) -> int:
    import numpy as np

    # Larger than this machine's per-core L2 (4 MiB): what the device step between two
    # planner calls does to the caches in a serving loop.
    flush = np.zeros(args.cold_caches << 17) if args.cold_caches else None
    versions = {"today": None}
    if args.against:
        versions[args.against] = planner_at(args.against)
    differ = 0
    for path in args.recordings:
        with open(path, "rb") as f:
            recording = pickle.load(f)
        calls = recording["calls"]
        steps = sum(name == "plan" for name, *_ in calls)
        best = {v: defaultdict(lambda: math.inf) for v in versions}
        outcome = {}
        for repeat in range(args.repeats):
            order = list(versions)[::1 if repeat % 2 == 0 else -1]  # alternate who goes first
            for version in order:
                spent, mismatches, first, decisions = _run(
                    _fresh_planner(recording["planner"], versions[version]), calls, flush)
                outcome[version] = (mismatches, first, decisions)
                for name, seconds in spent.items():
                    best[version][name] = min(best[version][name], seconds)
        differ += outcome["today"][0]
        totals = {}
        for version in versions:
            parts = "  ".join(f"{name} {1e6 * best[version][name] / steps:.0f}"
                              for name in CALLS if name in best[version])
            totals[version] = sum(best[version].values())
            label = f"{path}: {steps} plans; " if version == "today" else f"  {version}: "
            mismatches, first, decisions = outcome[version]
            print(f"{label}us per step, best of {args.repeats}: total "
                  f"{1e6 * totals[version] / steps:.0f} ({parts}); plans that differ: "
                  f"{mismatches}, {decisions} in a decision{first}")
        if args.against:
            print(f"  today / {args.against}: {totals['today'] / totals[args.against]:.3f}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="serve a workload and record the planner's calls")
    rec.add_argument("--workload", default="humaneval")
    rec.add_argument("--concurrency", type=int, default=1)
    rec.add_argument("--num-prompts", type=int, default=32)
    rec.add_argument("--max-tokens", type=int, default=64)
    rec.add_argument("--depth", type=int, default=7)
    rec.add_argument("--pair", default="lightspec_jax/assets/tiny-pair",
                     help="the shipped pair's folder (target/ and the drafter beside it)")
    rec.add_argument("--drafter", default="drafter",
                     help="the drafter's folder in the pair, or ngram (prompt lookup, no model)")
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay", help="time the planner on recorded calls")
    rep.add_argument("recordings", nargs="+")
    rep.add_argument("--repeats", type=int, default=10)
    rep.add_argument("--against", default=None, metavar="REV",
                     help="also replay the planner of this git revision, pass for pass "
                     "interleaved with today's, and print the ratio of their times")
    rep.add_argument("--cold-caches", type=int, default=0, metavar="MIB",
                     help="write through MIB MiB between calls, untimed, so each call starts "
                     "with cold caches as in a serving loop (32 comes near the loop's cost on "
                     "this CPU; default 0: hot, back to back)")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args)
    else:
        sys.exit(replay(args))


if __name__ == "__main__":
    main()
