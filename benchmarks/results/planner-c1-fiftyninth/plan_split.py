"""The dynamic planner's host time by call, a plan() that decided afresh (stage 2 ran) apart
from one that reused a decision: a recording of planner_replay.py replayed with cold caches
(32 MiB written through before every call, untimed), best of 5 passes.

    python benchmarks/planner_replay.py record --workload math --concurrency 1 \
        --num-prompts 32 --drafter ngram --out ng1.pkl
    python benchmarks/results/planner-c1-fiftyninth/plan_split.py ng1.pkl
"""
import collections
import pathlib
import pickle
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/
import numpy as np  # noqa: E402

import planner_replay  # noqa: E402


def main(path: str) -> None:
    with open(path, "rb") as f:
        recording = pickle.load(f)
    flush = np.zeros(32 << 17)
    best, count = None, collections.Counter()
    for _ in range(5):
        planner = planner_replay._fresh_planner(recording["planner"], None)
        fresh = [False]
        decide = planner._next_depth

        def next_depth(*a, **k):
            fresh[0] = True
            return decide(*a, **k)
        planner._next_depth = next_depth
        spent, count = collections.defaultdict(float), collections.Counter()
        for name, a, kw, _ in recording["calls"]:
            flush += 1.0
            fresh[0] = False
            start = time.perf_counter()
            out = getattr(planner, name)(*a, **kw)
            took = time.perf_counter() - start
            key = name if name != "plan" else ("plan, fresh" if fresh[0] else
                                               f"plan, {out.reason}")
            spent[key] += took
            count[key] += 1
        best = dict(spent) if best is None else {k: min(best[k], spent[k]) for k in spent}
    steps = sum(v for k, v in count.items() if k.startswith("plan"))
    print(f"{path}: {steps} plans, us per call and per step (best of 5)")
    for key in sorted(best):
        print(f"  {key:14s} calls {count[key]:5d}  per call {1e6 * best[key] / count[key]:6.0f}"
              f"  per step {1e6 * best[key] / steps:5.0f}")
    print(f"  total per step {1e6 * sum(best.values()) / steps:.0f}")


if __name__ == "__main__":
    main(sys.argv[1])
