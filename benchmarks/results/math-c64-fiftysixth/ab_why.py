"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftysixth/ab_why.py POLICY_AB_ARGS)
why dynamic drafts as the wave drains: each plan's reason and, for fresh
decisions, stage 2's calibrated price per token of the floor against the depth it chose."""
import atexit, collections, sys
import numpy as np
sys.path.insert(0, "benchmarks")
import ab_variants
import policy_ab

REC = []
orig_build = ab_variants.build


def build(variant, *a, **k):
    engine = orig_build(variant, *a, **k)
    planner = engine.planner
    if planner is None or not hasattr(planner, "_next_depth"):
        return engine
    nd, pl = planner._next_depth, planner._plan
    last = {}

    def _next_depth(costs, n):
        out = nd(costs, n)
        last["prices"] = list(planner._by_depth[2])
        last["choice"] = out[0]
        return out

    def _plan(*, n, **kw):
        last.clear()
        plan = pl(n=n, **kw)
        REC.append((n, plan.reason, plan.draft_depth, last.get("prices"), last.get("choice")))
        return plan

    planner._next_depth, planner._plan = _next_depth, _plan
    return engine


def report():
    bands = [(1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 64)]
    for lo, hi in bands:
        sel = [r for r in REC if lo <= r[0] <= hi]
        if not sel:
            continue
        reasons = collections.Counter((r[1], "floor" if r[2] == 0 else "draft") for r in sel)
        fresh = [r for r in sel if r[3] is not None]
        ratios = [r[3][0] / min(r[3][1:]) for r in fresh if len(r[3]) > 1]
        print(f"N {lo}-{hi}: {len(sel)} plans {dict(reasons)}; fresh decisions {len(fresh)}, "
              f"floor price / best drafting price: median "
              f"{np.median(ratios) if ratios else float('nan'):.3f}, "
              f"share > 1: {np.mean(np.array(ratios) > 1) if ratios else float('nan'):.2f}")


atexit.register(report)
policy_ab.build = build
policy_ab.main()
