"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftysixth/ab_pred.py POLICY_AB_ARGS)
policy_ab where each dynamic variant's planner logs, for every step it observes, the plan's
predicted ms and tokens (plan.predicted_ms: the cost model's, before the whole-step
calibration; plan.predicted_tokens: before the token calibration) beside the tokens the step
committed and the wall time since the previous observe() call (under 200 ms apart: the loop's
period, prompt work included where a step carried a chunk); printed after the run by requests
decoded (N)."""
import collections
import sys
import time

import numpy as np

sys.path.insert(0, "benchmarks")
import policy_ab  # noqa: E402

LOG = collections.defaultdict(list)  # label -> [record of each observed step]


def log_steps(variant, engine):
    planner = engine.planner
    if planner is None or not hasattr(planner, "observe_period"):
        return
    log, observe, last = LOG[variant.label], planner.observe, [None]

    def logged(obs):
        now = time.perf_counter()
        record = {"plan": obs.plan, "tokens": int(np.sum(obs.accept_lens))}
        if last[0] is not None and now - last[0] < 0.2:
            record["ms"] = 1e3 * (now - last[0])
        log.append(record)
        last[0] = now
        return observe(obs)

    planner.observe = logged


def report():
    edges = [(1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 64)]
    for label, log in LOG.items():
        print(f"{label}: steps with a period and an outcome, by N "
              "(predicted vs measured: ms, tokens, tokens/ms)")
        rows = [r for r in log if "ms" in r and np.isfinite(r["plan"].predicted_ms)
                and np.isfinite(r["plan"].predicted_tokens)]
        for lo, hi in edges:
            sel = [r for r in rows if lo <= r["plan"].num_requests <= hi]
            if not sel:
                continue
            pm = sum(r["plan"].predicted_ms for r in sel); mm = sum(r["ms"] for r in sel)
            pt = sum(r["plan"].predicted_tokens for r in sel); mt = sum(r["tokens"] for r in sel)
            deep = collections.Counter(r["plan"].verified_depth for r in sel)
            print(f"  N {lo}-{hi}: {len(sel)} steps  ms {pm/len(sel):6.2f} vs {mm/len(sel):6.2f} "
                  f"(x{mm/pm:.2f})  tok {pt/len(sel):6.1f} vs {mt/len(sel):6.1f} (x{mt/pt:.2f})  "
                  f"tok/ms {pt/pm:.2f} vs {mt/mm:.2f}  verified {dict(sorted(deep.items()))}")


policy_ab.main_with(log_steps)
report()
