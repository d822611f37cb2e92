"""The synthetic verifier's floor, side by side: what a floor step's outcome draws cost the
dynamic engine on the near-free model under churn (host_overhead.py's model and window).

SyntheticAcceptance draws no outcomes for a step that verifies no draft (the floor), since
the step reads none; the engine before drew them every step. Three engines in one process,
their windows interleaved in rotated order: plain decoding, dynamic:7, and dynamic:7 whose
verifier is told that every step verifies (the draws of before). Median of --repeats.

    python benchmarks/synthetic_floor_ab.py --concurrency 64 256 --repeats 4
"""

from __future__ import annotations

import argparse
import statistics

import host_overhead as ho

NAMES = ("none", "dynamic:7", "dynamic:7, every step draws")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--churn", type=int, nargs=2, default=[16, 48], metavar=("LO", "HI"))
    args = ap.parse_args()
    max_tokens = 1024  # as host_overhead.py
    print("| c | engine | ms/step | tokens/step | tokens/ms | x plain | host ms |")
    print("|---|---|---|---|---|---|---|")
    for c in args.concurrency:
        engines = {name: ho.build_engine(name.split(",")[0], c, max_model_len=max_tokens + 16)
                   for name in NAMES}
        verifier = engines[NAMES[2]].verifier
        draws = verifier.host_inputs
        verifier.host_inputs = lambda active, verifies=True: draws(active, verifies=True)
        runs = {name: [] for name in NAMES}
        for rep in range(args.repeats):
            for name in NAMES[rep % 3:] + NAMES[:rep % 3]:
                runs[name].append(ho.timed_window(
                    engines[name], concurrency=c, warmup=8, steps=args.steps,
                    max_tokens=max_tokens, tag=f"r{rep}", churn=tuple(args.churn)))

        def median(name, f):
            return statistics.median(f(r) for r in runs[name])

        plain = median("none", lambda r: r["tokens_per_step"] / r["ms_per_step"])
        for name in NAMES:
            rate = median(name, lambda r: r["tokens_per_step"] / r["ms_per_step"])
            print(f"| {c} | {name} | {median(name, lambda r: r['ms_per_step']):.2f} | "
                  f"{median(name, lambda r: r['tokens_per_step']):.1f} | {rate:.1f} | "
                  f"{rate / plain:.2f} | {median(name, lambda r: r['host_ms_per_step']):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
