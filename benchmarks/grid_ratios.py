"""The planner grid's per-cell ratio - dynamic over the best other policy - read from
`lightspec-bench serve` results, in sample and held out.

The planner issue's bar compares dynamic with the best other policy of each cell. Taken from
the same repeats (in sample, the issue's reading), that best is the largest of several
medians. Where several policies tie within this machine's noise (at c = 1 static K = 3, 5 and
7 often sit within 3-5%), the largest of them sits above each one by chance, and a dynamic
policy level with all of them reads below 1. Held out, the best other policy is chosen on some
of the repeats and the ratio is measured on the others, for every such split (the larger part
chooses): the choice's luck does not enter the ratio it is judged by. Each repeat of a serve
run times every policy in one rotated round, so repeat i of two policies ran minutes apart at
most; the repeats are paired by that round.

    python benchmarks/grid_ratios.py DIR/sharegpt DIR/humaneval DIR/math [--policy dynamic:7]
    # two runs of the same code, pooled cell by cell
    python benchmarks/grid_ratios.py RUN1/{sharegpt,humaneval,math} RUN2/{sharegpt,humaneval,math}

Each argument is a serve.json or the folder holding one (`lightspec-bench serve --out`),
named by its folder. Prints a Markdown table (one row per workload and concurrency), how many
cells reach 0.95 and 1.0 each way, and flags a cell whose speculative output differed from
plain decoding.

Runs of one workload given together (the same folder name) are pooled. On this machine two
identical engines in one run read up to 10% apart, so one run's cell cannot place it on
either side of a 0.95 bar. Each run's repeats stay paired by its own rounds. A cell is read
over the repeats of every run that served it, for the policies that all of them ran. Pool
only runs of the same code.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics

from lightspec_jax.bench.report import by_round


def load(path: str) -> tuple[str, list[dict]]:
    """(workload name, rows) of one serve result: a serve.json or the folder holding one; the
    name is the file's folder."""
    if os.path.isdir(path):
        path = os.path.join(path, "serve.json")
    with open(path) as f:
        rows = json.load(f)["rows"]
    return os.path.basename(os.path.dirname(os.path.abspath(path))), rows


def paired(rows: list[dict]) -> dict[str, list[float]]:
    """Policy -> its tok/s per repeat, in the order of the rounds every policy ran in."""
    rounds = [by_round(r) for r in rows]
    common = sorted(set.intersection(*(set(b) for b in rounds)))
    if not common:
        raise ValueError(
            f"no round that every policy at c = {rows[0]['concurrency']} ran in: a serve run "
            "with several drafters times each drafter's engines in rounds of its own; pass "
            "one drafter's results")
    return {r["policy"]: [b[k] for k in common] for r, b in zip(rows, rounds)}


def cell_ratios(runs: dict[str, list[float]], policy: str) -> dict:
    """`policy`'s ratio to the best other policy of one cell (runs: policy -> tok/s per paired
    repeat): in sample (medians over every repeat) and held out (the median, over every split
    of the repeats, of the ratio of medians on the repeats the best was not chosen on)."""
    mine = runs[policy]
    others = {k: v for k, v in runs.items() if k != policy}
    if not others:
        raise ValueError(f"no other policy to compare {policy} with")
    median = statistics.median

    def best_on(repeats):
        return max(others, key=lambda k: median([others[k][i] for i in repeats]))

    count = len(mine)
    best = best_on(range(count))
    out = {"best": best, "in_sample": median(mine) / median(others[best]), "repeats": count,
           "held_out": None}
    if count >= 2:
        ratios = []
        for choose in itertools.combinations(range(count), (count + 1) // 2):
            judge = [i for i in range(count) if i not in choose]
            chosen = best_on(choose)
            ratios.append(median([mine[i] for i in judge])
                          / median([others[chosen][i] for i in judge]))
        out["held_out"] = median(ratios)
    return out


def grid(results: list[tuple[str, list[dict]]], policy: str) -> list[dict]:
    """One entry per (workload, concurrency) that served `policy`, over every run of it in
    `results` (pooled): its ratios, how many runs it pools, and whether every row of the cell
    was token-identical to plain decoding where that was checked."""
    runs: dict[tuple[str, int], list[list[dict]]] = {}  # (workload, c) -> each run's rows
    for workload, rows in results:
        for c in dict.fromkeys(r["concurrency"] for r in rows):
            cell = [r for r in rows if r["concurrency"] == c]
            if any(r["policy"] == policy for r in cell):
                runs.setdefault((workload, c), []).append(cell)
    cells = []
    for (workload, c), cell_runs in runs.items():
        cells.append({"workload": workload, "concurrency": c, "runs": len(cell_runs),
                      "identical": all(r.get("identical_to_none", True)
                                       for cell in cell_runs for r in cell),
                      **cell_ratios(pooled(cell_runs), policy)})
    return cells


def pooled(cell_runs: list[list[dict]]) -> dict[str, list[float]]:
    """Policy -> its tok/s per repeat over several runs of one cell: each run's repeats paired
    by its rounds (`paired`), run after run, for the policies every run served."""
    each = [paired(cell) for cell in cell_runs]
    common = [k for k in each[0] if all(k in runs for runs in each[1:])]
    return {k: [x for runs in each for x in runs[k]] for k in common}


def report(cells: list[dict], policy: str) -> str:
    lines = [f"| workload | c | repeats | {policy} / best other, in sample (which) | held out |",
             "|---|---|---|---|---|"]
    for x in cells:
        held = "-" if x["held_out"] is None else f"{x['held_out']:.3f}"
        flag = "" if x["identical"] else " (output differs from plain decoding)"
        repeats = x["repeats"] if x["runs"] == 1 else f"{x['repeats']} ({x['runs']} runs)"
        lines.append(f"| {x['workload']} | {x['concurrency']} | {repeats} | "
                     f"{x['in_sample']:.3f} ({x['best']}){flag} | {held} |")
    for key, label in (("in_sample", "in sample"), ("held_out", "held out")):
        values = [x[key] for x in cells if x[key] is not None]
        if values:
            lines.append(f"{label}: {sum(v >= 0.95 for v in values)} of {len(values)} cells "
                         f">= 0.95, {sum(v >= 1.0 for v in values)} >= 1.0, mean "
                         f"{statistics.fmean(values):.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="serve.json files or the folders holding them")
    parser.add_argument("--policy", default="dynamic:7",
                        help="the policy compared with the others (default dynamic:7)")
    args = parser.parse_args(argv)
    try:
        cells = grid([load(p) for p in args.results], args.policy)
    except ValueError as e:
        raise SystemExit(f"grid_ratios: {e}") from None
    if not cells:
        raise SystemExit(f"no cell served {args.policy}")
    print(report(cells, args.policy))
    return 0 if all(x["identical"] for x in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
