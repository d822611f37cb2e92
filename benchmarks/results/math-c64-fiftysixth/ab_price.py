"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftysixth/ab_price.py POLICY_AB_ARGS)
policy_ab where each dynamic variant's fresh decisions are taken apart: for the floor and
for the cheapest drafting depth, stage 2's bucket, model ms (device and host, as the
planner's cost model prices them), calibration scale and calibrated tokens; medians printed
after the run by band of requests decoded (N)."""
import collections
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
import policy_ab  # noqa: E402

ROWS = collections.defaultdict(list)  # (label, band) -> [(floor parts, drafting parts, ...)]


def band(n):
    return max(int(n), 1).bit_length()


def parts(g, tokens, j, i):
    c = int(np.argmin(j[i]))
    return (int(g.depths[i]), int(g.buckets[c]), float(g.step_ms[i, c]), float(g.scales[i, c]),
            float(tokens[i, c]), float(j[i, c]))


def log_prices(variant, engine):
    planner = engine.planner
    if planner is None or not hasattr(planner, "_next_depth"):
        return
    decide = planner._next_depth

    def _next_depth(costs, n):
        out = decide(costs, n)
        g, depths = planner._stage2, planner._by_depth[0]
        # Stage 2's calibrated tokens and prices (planner/lightspec.py, _next_depth), which it
        # does not keep; without its mask of depths whose fill does not reach them.
        tokens = np.minimum(np.maximum(g.u * g.progress, n), g.full[:, None])
        if planner.options.calibrate_tokens:
            tokens = n + planner.tokens.factors(depths)[:, None] * (tokens - n)
        j = np.where(g.valid, g.step_ms * g.scales / tokens, np.inf)
        if depths[0] == 0 and len(depths) > 1 and np.isfinite(j[1:]).any():
            best = 1 + int(np.argmin(j[1:].min(axis=1)))
            ROWS[variant.label, band(n)].append(
                (parts(g, tokens, j, 0), parts(g, tokens, j, best), out[0],
                 float(costs.host(False)), float(costs.host(True))))
        return out

    planner._next_depth = _next_depth


def report():
    for (label, b), rows in sorted(ROWS.items()):
        floor = np.array([r[0] for r in rows]); draft = np.array([r[1] for r in rows])
        chose = np.mean([r[2] > 0 for r in rows])
        host = np.median([r[3] for r in rows]), np.median([r[4] for r in rows])
        med = lambda a, k: float(np.median(a[:, k]))  # noqa: E731
        print(f"{label} N {2 ** (b - 1)}-{2 ** b - 1}: {len(rows)} fresh decisions, drafted after "
              f"{chose:.0%}; host ms priced floor {host[0]:.2f}, drafting {host[1]:.2f}")
        for name, a in (("floor", floor), ("drafting", draft)):
            print(f"    {name:8s} depth {med(a, 0):.0f} bucket {med(a, 1):.0f}: model ms "
                  f"{med(a, 2):6.2f} x scale {med(a, 3):.2f} / tokens {med(a, 4):6.1f} "
                  f"= {med(a, 5):.3f} ms a token")


policy_ab.main_with(log_prices)
report()
