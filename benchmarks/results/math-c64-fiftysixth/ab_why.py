"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftysixth/ab_why.py POLICY_AB_ARGS)
why dynamic drafts as the wave drains: each plan's reason and, for fresh
decisions, stage 2's calibrated price per token of the floor against the depth it chose."""
import collections
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
import policy_ab  # noqa: E402

REC = []  # (N, reason, depth drafted, stage 2's price by depth or None) of each plan


def log_plans(variant, engine):
    planner = engine.planner
    if planner is None or not hasattr(planner, "_next_depth"):
        return
    decide, plan_step = planner._next_depth, planner._plan
    prices = [None]  # stage 2's, when this plan() call decided afresh

    def _next_depth(costs, n):
        out = decide(costs, n)
        prices[0] = list(planner._by_depth[2])
        return out

    def _plan(*, n, **kw):
        prices[0] = None
        plan = plan_step(n=n, **kw)
        REC.append((n, plan.reason, plan.draft_depth, prices[0]))
        return plan

    planner._next_depth, planner._plan = _next_depth, _plan


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


policy_ab.main_with(log_plans)
report()
