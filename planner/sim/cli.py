"""The simulator's command line: run arguments, worker processes, the report.

    python -m lightspec_jax.planner.sim.simulate --all     (or: lightspec-bench simulate --all)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time

from ..synthetic import PROFILES
from ..types import geometric_buckets
from .costmodel import RooflineCostModel, TableCostModel, profile_host, profile_tables
from .report import format_report
from .policies import ABLATION_POLICIES, CONCURRENCIES, MAIN_POLICIES, POLICIES
from .simulate import SimConfig, default_requests, pooled, run


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """How each simulation runs (cost model, overheads, requests, buckets, seed, workers):
    shared by this module's CLI and `lightspec-bench simulate`."""
    parser.add_argument("--cost-model", choices=("roofline", "table"), default="roofline",
                        help="ground-truth step times: the H200 roofline, or a --cost-table file")
    parser.add_argument("--cost-table", metavar="PATH", default=None,
                        help='JSON {"target": CostTable, "draft": CostTable}; implies '
                             "--cost-model table (default: none)")
    parser.add_argument("--target-overhead-ms", type=float, default=None,
                        help="roofline fixed cost per target step (default: the calibrated 2.22)")
    parser.add_argument("--draft-overhead-ms", type=float, default=None,
                        help="roofline fixed cost per draft forward (default: the calibrated "
                             "1.10)")
    parser.add_argument("--host-base-ms", type=float, default=None,
                        help="roofline host ms per step, fixed part (default: 1.0; see "
                             "planner/sim/costmodel.py)")
    parser.add_argument("--host-per-request-ms", type=float, default=None,
                        help="roofline host ms per step and request (default: 0.0586, the "
                             "H200 loop's; 0.0067 is this CPU loop's)")
    parser.add_argument("--no-host-cost", action="store_true",
                        help="no host time: steps cost their device time alone (the simulator "
                             "before host costs)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="the loop does not hide host time: a step costs device + host "
                             "(default: max(device, host))")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per run (default: max(4 x concurrency, 32))")
    parser.add_argument("--steps-per-octave", type=int, default=4,
                        help="verify bucket density: sizes per doubling of rows (default: 4)")
    parser.add_argument("--no-draft-at-prefill", action="store_true",
                        help="new requests have no proposal on their first decode step")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of requests and acceptance draws (default: 0)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="seeds per cell, from --seed on; a cell reports their runs pooled "
                             "(every seed's tokens over every seed's simulated time) and the "
                             "bars count the seeds where dynamic held (default: 1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: every CPU)")


def check_run_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses run arguments no simulation can take (parser.error exits)."""
    if args.cost_table:
        TableCostModel.load(args.cost_table)  # fail early, with the file's own error
    elif args.cost_model == "table":
        parser.error("--cost-model table needs --cost-table PATH")
    if any(c < 1 for c in args.concurrency):
        parser.error(f"concurrency levels must be >= 1, got {args.concurrency}")
    for name in ("requests", "seeds", "jobs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")


def run_cells(groups: list[tuple[str, list[str]]], args: argparse.Namespace
              ) -> tuple[list[dict], float]:
    """Every (profile, concurrency, policy) cell of `groups` ([(profile, policy keys)]) at
    args.concurrency, each under args.seeds seeds pooled (simulate.pooled), on args.jobs
    worker processes: (one RunResult.summary() per cell, wall seconds)."""
    overrides = roofline_overrides(args)
    cells = [(profile, c, key) for profile, policies in groups for c in args.concurrency
             for key in policies]
    tasks = [(SimConfig(profile=profile, concurrency=c, policy=key,
                        num_requests=args.requests or default_requests(c),
                        **config_options(args, seed=args.seed + i)), args.cost_table, overrides)
             for profile, c, key in cells for i in range(args.seeds)]
    # Low concurrency takes the most steps: starting those first keeps the workers even.
    order = sorted(range(len(tasks)), key=lambda i: tasks[i][0].concurrency)
    start = time.perf_counter()
    if args.jobs > 1 and len(tasks) > 1:
        with concurrent.futures.ProcessPoolExecutor(min(args.jobs, len(tasks))) as pool:
            done = list(pool.map(run_task, [tasks[i] for i in order]))
    else:
        done = [run_task(tasks[i]) for i in order]
    runs = [None] * len(tasks)
    for i, summary in zip(order, done):
        runs[i] = summary
    wall = time.perf_counter() - start
    return [pooled(runs[i:i + args.seeds]) for i in range(0, len(runs), args.seeds)], wall


def roofline_overrides(args: argparse.Namespace) -> dict:
    """RooflineCostModel fields the run arguments override."""
    names = ("target_overhead_ms", "draft_overhead_ms", "host_base_ms", "host_per_request_ms")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def config_options(args: argparse.Namespace, seed: int | None = None) -> dict:
    """SimConfig fields the run arguments set (everything but profile, concurrency, policy and
    the request count); seed: one of the run's seeds instead of --seed."""
    return dict(seed=args.seed if seed is None else seed, steps_per_octave=args.steps_per_octave,
                draft_at_prefill=not args.no_draft_at_prefill, host_cost=not args.no_host_cost,
                overlap=not args.no_overlap)


def describe_costs(args: argparse.Namespace) -> str:
    """The cost model and loop a report was run with, in words."""
    if args.cost_table:
        name = args.cost_table
        host = "host from the file's table, if any"
    else:
        model = RooflineCostModel(**roofline_overrides(args))
        name = model.name
        host = f"host {model.host_base_ms:g} + {model.host_per_request_ms:.4g}·N ms per step"
    if args.no_host_cost:
        return f"{name}; no host time"
    return f"{name}; {host}, {'added to' if args.no_overlap else 'overlapped with'} device time"


def all_groups() -> list[tuple[str, list[str]]]:
    """--all: every profile with the main policies, plus the ablations on chat and code."""
    groups = [(p, list(MAIN_POLICIES)) for p in sorted(PROFILES)]
    return groups + [(p, [q for q in ABLATION_POLICIES if q not in MAIN_POLICIES])
                     for p in ("chat", "code")]


def run_task(args):
    """One simulation from (SimConfig, cost-table path or None, roofline overrides): picklable,
    for worker processes."""
    config, cost_path, overrides = args
    cost = TableCostModel.load(cost_path) if cost_path else RooflineCostModel(**overrides)
    return run(config, cost).summary()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lightspec-bench simulate",
        description="Closed-loop serving simulation of speculative-decoding planners "
                    "(static K, LightSpec dynamic, DSpark-style) against two oracles, with and "
                    "without hindsight (oracle, informed).")
    parser.add_argument("--profiles", nargs="+", default=["chat"], choices=sorted(PROFILES),
                        help="workload profiles (default: chat)")
    parser.add_argument("--concurrency", nargs="+", type=int, default=list(CONCURRENCIES),
                        help="concurrency levels (default: %(default)s)")
    parser.add_argument("--policies", nargs="+", default=list(MAIN_POLICIES),
                        choices=sorted(POLICIES), help="policies (default: %(default)s)")
    parser.add_argument("--all", action="store_true",
                        help="every profile, the default concurrencies and policies, plus "
                             "ablations on chat and code: the run behind "
                             "benchmarks/results/simulate.md")
    parser.add_argument("--write-cost-table", metavar="PATH",
                        help="write the roofline's start-up tables in that format and exit")
    add_run_arguments(parser)
    parser.add_argument("--json", metavar="PATH", help="also write every run's metrics as JSON")
    args = parser.parse_args(argv)

    overrides = roofline_overrides(args)
    if args.write_cost_table:
        model = RooflineCostModel(**overrides)
        target, draft = profile_tables(model, geometric_buckets(4096))
        host = None if args.no_host_cost else profile_host(model, range(1, 1025))
        TableCostModel(target=target, draft=draft, host=host).save(args.write_cost_table)
        return 0
    check_run_arguments(parser, args)
    groups = all_groups() if args.all else [(p, args.policies) for p in args.profiles]
    results, wall = run_cells(groups, args)
    cost_name = describe_costs(args)
    command = "python -m lightspec_jax.planner.sim.simulate " + " ".join(
        argv if argv is not None else sys.argv[1:])
    print(format_report(results, cost_name=cost_name, command=command.strip(), wall_s=wall,
                        jobs=args.jobs))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"command": command.strip(), "wall_s": wall, "runs": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
