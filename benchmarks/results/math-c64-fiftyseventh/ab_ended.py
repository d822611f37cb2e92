"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftyseventh/ab_ended.py POLICY_AB_ARGS)
policy_ab where, for each dynamic variant, every decode step read back (no prompt chunk) is
logged: the requests its plan was made for (N) and those still live when it ran (a request
can end on the device in the step before, while this one was planned: the host reads that
step back only after), how many of the ended ones were certain to end when it was planned
(allowance <= the in-flight step's one token), the plan's predicted tokens against those
committed, and whether the rows the live requests used fit a smaller verify bucket than the
one that ran. Printed by band of the plan's N."""
import collections
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
import policy_ab  # noqa: E402

LOG = collections.defaultdict(list)
EDGES = [(1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 64)]


def hook(variant, engine):
    planning, fb = engine.planning, engine.planning.feedback
    if fb is None:
        return
    certain = {}  # id(plan) -> requests whose allowance the in-flight step uses up
    choose, learn, log = planning._choose, fb.learn, LOG[variant.label]

    def chosen(batch, scheduler, lag):
        plan = choose(batch, scheduler, lag)
        left = scheduler.remaining[scheduler.decoding]
        certain[id(plan)] = (plan, int(np.count_nonzero(left <= lag)))
        return plan

    def learned(flight, readback, *, columns, live, **kw):
        plan = flight.plan
        held = certain.pop(id(plan), None)
        if plan.num_requests and not flight.prefill_rows and held is not None:
            acc = readback[live, columns.accepted]
            used = int((readback[live, columns.verified] + 1).sum())
            tok = float(np.sum(np.minimum(acc, plan.verified_depth) + 1))
            smaller = planning.planner.spec.bucket_for(max(used, 1)) < plan.verify_rows
            log.append((plan.num_requests, int(live.sum()), held[1], plan.predicted_tokens,
                        tok, smaller, plan.at_floor))
        return learn(flight, readback, columns=columns, live=live, **kw)

    planning._choose, fb.learn = chosen, learned


policy_ab.main_with(hook)
for label, log in LOG.items():
    print(f"{label}: decode steps by the plan's N - requests planned, live when it ran, "
          "certain to end when planned; predicted vs committed tokens; steps whose live "
          "rows fit a smaller bucket")
    for lo, hi in EDGES:
        sel = [r for r in log if lo <= r[0] <= hi and np.isfinite(r[3])]
        if not sel:
            continue
        a = np.array(sel, dtype=float)
        ended = a[:, 0].sum() - a[:, 1].sum()
        print(f"  N {lo}-{hi}: {len(sel)} steps ({int(a[:, 6].sum())} floor)  planned "
              f"{a[:, 0].mean():.1f} live {a[:, 1].mean():.1f} (ended {ended / len(sel):.1f}, "
              f"certain {a[:, 2].mean():.1f})  tokens {a[:, 3].mean():.1f} vs {a[:, 4].mean():.1f}"
              f" (x{a[:, 4].sum() / a[:, 3].sum():.2f}; a live request x"
              f"{(a[:, 4].sum() / a[:, 1].sum()) / (a[:, 3].sum() / a[:, 0].sum()):.2f})  "
              f"smaller bucket {int(a[:, 5].sum())}")
