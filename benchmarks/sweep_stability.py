"""How much the start-up bucket sweep's verify table moves from one sweep to the next.

One engine (the shipped pair, dynamic, the serving benchmark's buckets for a concurrency) is
swept N times each way, the two ways alternated: `rounds`, the engine's sweep (each round times
every bucket and depth once; the verify prices fitted non-decreasing in rows), and `per-bucket`,
the order before the forty-ninth session (each bucket's repeats back to back, no fit), rebuilt
here from the same timing code. A table's shape - each bucket's price over the sweep's level
(the geometric mean of its prices) - is what the planner's choices read (the online refresh
keeps it for good), so this prints each way's tables, the spread of each bucket's shape over
the sweeps (largest over smallest), and how many sweeps priced a bucket under a smaller one.

    python benchmarks/sweep_stability.py --concurrency 4 --sweeps 6
"""

from __future__ import annotations

import argparse
import types

import numpy as np


def per_bucket_sweep(costs, runner, depths):
    """profile_costs with the pre-round order: every work item's repeats back to back."""
    rounds, fit = costs._time_rounds, costs.non_decreasing

    def item_by_item(runner, work, **kwargs):
        kwargs.pop("progress", None)
        return [rounds(runner, [item], **kwargs)[0] for item in work]

    costs._time_rounds, costs.non_decreasing = item_by_item, list
    try:
        return costs.profile_costs(runner, depths=depths, show_progress=False)
    finally:
        costs._time_rounds, costs.non_decreasing = rounds, fit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--depth", type=int, default=7)
    parser.add_argument("--sweeps", type=int, default=6, help="sweeps each way")
    args = parser.parse_args()

    from lightspec_jax.assets import tiny_pair
    from lightspec_jax.bench.serve import build_engine
    from lightspec_jax.engine import costs

    pair = tiny_pair()
    engine = build_engine(types.SimpleNamespace(target=str(pair.target),
                                                drafter=str(pair.drafter), dtype="float32"),
                          policy="dynamic", depth=args.depth, concurrency=args.concurrency,
                          max_model_len=400, longest_prompt=256, cost_cache_dir=None)
    runner, depths = engine.runner, tuple(range(1, args.depth + 1))
    sizes = runner.decode_registry.sizes
    tables: dict[str, list[list[float]]] = {"rounds": [], "per-bucket": []}
    for i in range(args.sweeps):
        for way in ("rounds", "per-bucket")[::1 if i % 2 == 0 else -1]:
            profile = (costs.profile_costs(runner, depths=depths, show_progress=False)
                       if way == "rounds" else per_bucket_sweep(costs, runner, depths))
            tables[way].append([profile.target.estimate(b) for b in sizes])
    np.set_printoptions(precision=2, suppress=True, linewidth=160)
    print(f"verify buckets {list(sizes)}; {args.sweeps} sweeps each way, alternated")
    for way, rows in tables.items():
        ms = np.array(rows)  # [sweeps, buckets]
        shape = ms / np.exp(np.log(ms).mean(axis=1, keepdims=True))
        spread = shape.max(0) / shape.min(0)
        print(f"\n{way}: ms per step, one sweep a line\n{ms}")
        print(f"  shape (over the sweep's geometric mean), mean: {shape.mean(0)}")
        print(f"  shape spread over the sweeps (max / min): {spread}, mean {spread.mean():.3f}")
        print(f"  sweeps pricing a bucket under a smaller one: "
              f"{int((np.diff(ms, axis=1) < 0).any(axis=1).sum())} of {len(ms)}")


if __name__ == "__main__":
    main()
