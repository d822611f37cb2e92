"""The table of BENCHMARKS.md, "Fifty-fourth session": dynamic over the best other policy of
each policy_ab run in this folder, with the paired interval (paired_ratios.over_best); the two
ShareGPT c = 4 runs also pooled, repeats kept in their pairs.

    python benchmarks/results/long-readings-fiftyfourth/cell_table.py
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # benchmarks/
import numpy as np  # noqa: E402
from paired_ratios import over_best  # noqa: E402
D = HERE + "/"
cells = [("sharegpt", 1, ["sharegpt_c1"]), ("sharegpt", 4, ["sharegpt_c4", "sharegpt_c4_second"]),
         ("sharegpt", 16, ["sharegpt_c16"]), ("sharegpt", 64, ["sharegpt_c64"]),
         ("humaneval", 1, ["humaneval_c1"]), ("humaneval", 4, ["humaneval_c4"]),
         ("humaneval", 16, ["humaneval_c16"]), ("humaneval", 64, ["humaneval_c64"]),
         ("math", 1, ["math_c1"]), ("math", 4, ["math_c4"]), ("math", 16, ["math_c16"]),
         ("math", 64, ["math_c64"]),
         ("math, n-gram", 16, ["ngram_math_c16", "ngram_math_c16_exploration"])]
def load(name):
    runs = {}
    for line in open(D + name + ".txt"):
        m = re.match(r"^\s*(\S+)\s+([0-9.]+) \[([0-9 ]+)\]", line)
        if m:
            runs[m.group(1)] = np.array(m.group(3).split(), float)
    return runs
for w, c, names in cells:
    try:
        parts = [load(n) for n in names]
    except FileNotFoundError:
        continue
    readings = [("", p) for p in parts]
    if len(parts) > 1:  # every run's repeats, each still beside its own reference
        readings.append(("pooled", {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}))
    for tag, runs in readings:
        best, ratio, mid, lo, hi = over_best(runs)["dyn"]
        means = {k: v.mean() for k, v in runs.items()}
        others = ", ".join(f"{k} {means[k] / means[best]:.3f}" for k in runs
                           if k not in ("dyn", best))
        repeats = f"{len(runs['dyn'])} {tag}".strip()
        print(f"| {w} | {c} | {repeats} | {best} ({means[best]:.0f} tok/s) | "
              f"{ratio:.3f} | {mid:.3f} | {lo:.3f}-{hi:.3f} | {others} |")
