"""`lightspec-bench simulate`: the planner's closed-loop simulator under the bench's policy names.

The simulator (lightspec_jax.planner.sim.policies) keys its policies as static-3, dspark-11,
...; here they are spelled as `serve` spells them (static:3, dynamic:11, dspark:7, plus
oracle:11, informed:11 and the named ablations), mapped onto the simulator's keys, and printed
back the same way.
"""

from __future__ import annotations

import argparse
import re
import shlex

from .policies import parse_policy, policy_name

_KINDS = ("static", "dynamic", "dspark", "oracle", "informed")


def simulator_names() -> dict[str, str]:
    """Bench name -> the simulator's policy key, for every policy the simulator defines."""
    from lightspec_jax.planner.sim.policies import POLICIES

    out = {}
    for key, policy in POLICIES.items():
        # Ablations (planner options or the floor set) keep their descriptive key; the plain
        # ones are exactly "kind at depth K" and take the bench spelling.
        out[key if policy.is_ablation else policy_name(policy.kind, policy.max_depth)] = key
    return out


def resolve(text: str) -> str:
    """A policy as typed (static:3, static-3, dynamic, oracle, dynamic-no-refresh) -> the
    simulator's key; raises ArgumentTypeError naming what the simulator has."""
    from lightspec_jax.planner.sim.policies import POLICIES

    names = simulator_names()
    if text in names:
        return names[text]
    if text in POLICIES and text in names.values():
        return text  # a simulator key that is also its own bench name (an ablation)
    try:
        kind, k = parse_policy(text, kinds=_KINDS)
    except argparse.ArgumentTypeError as e:
        if text == "none":
            raise argparse.ArgumentTypeError(
                "the simulator compares speculative policies; 'none' (plain decoding) is not "
                "simulated") from None
        raise argparse.ArgumentTypeError(f"{e}; the simulator has {_available(names)}") from None
    if k is None and kind in POLICIES:  # bare kind: the simulator's own default depth
        return kind
    name = policy_name(kind, k)
    if name not in names:
        raise argparse.ArgumentTypeError(f"the simulator has no policy {name!r}; it has "
                                         f"{_available(names)}")
    return names[name]


def bench_name(key: str) -> str:
    """The simulator's key -> its bench spelling (inverse of resolve)."""
    return {v: k for k, v in simulator_names().items()}[key]


def _available(names: dict[str, str]) -> str:
    return ", ".join(names)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The simulator's options (defaults from its module, so the two CLIs cannot drift)."""
    from lightspec_jax.planner.sim.cli import add_run_arguments
    from lightspec_jax.planner.sim.policies import CONCURRENCIES, MAIN_POLICIES
    from lightspec_jax.planner.synthetic import PROFILES

    p.add_argument("--profiles", nargs="+", default=["chat"], choices=sorted(PROFILES),
                   metavar="PROFILE",
                   help=f"synthetic workload profiles, any of {', '.join(sorted(PROFILES))}")
    p.add_argument("--concurrency", nargs="+", type=int, default=list(CONCURRENCIES),
                   metavar="C", help="requests in flight, one run per level")
    p.add_argument("--policies", nargs="+", type=_policy_arg, metavar="POLICY",
                   default=[bench_name(k) for k in MAIN_POLICIES],
                   help="static:K, dynamic[:K], dspark[:K], oracle[:K] (the simulator has: "
                        f"{_available(simulator_names())}); a bare name takes the simulator's "
                        "depth; static-3 is accepted as static:3")
    p.add_argument("--all", action="store_true",
                   help="every profile with the default concurrencies and policies, plus the "
                        "ablations on chat and code: the run behind "
                        "benchmarks/results/simulate.md")
    add_run_arguments(p)


def _policy_arg(text: str) -> str:
    return bench_name(resolve(text))


def simulate(args, parser: argparse.ArgumentParser, argv: list[str]) -> dict:
    from lightspec_jax.planner.sim.report import format_report
    from lightspec_jax.planner.sim.cli import (all_groups, check_run_arguments, describe_costs,
                                               run_cells)

    check_run_arguments(parser, args)
    keys = [resolve(name) for name in args.policies]
    runs, wall = run_cells(all_groups() if args.all else [(p, keys) for p in args.profiles],
                           args)
    for r in runs:  # the printed and saved label is the name the user types
        r["label"] = bench_name(r["policy"])
    command = shlex.join(["lightspec-bench", "simulate", *argv])
    cost_name = describe_costs(args)
    report = format_report(runs, cost_name=cost_name, command=command, wall_s=wall,
                           jobs=args.jobs)
    # The report's column heads still use the simulator's "static K=3" spelling.
    print(re.sub(r"\bstatic K=(\d+)", r"static:\1", report), flush=True)
    return {"command": "simulate", "wall_s": wall, "cost_model": cost_name,
            "policies": {bench_name(k): k for k in dict.fromkeys(r["policy"] for r in runs)},
            "runs": runs}
