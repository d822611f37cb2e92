"""The planner's time inside the serving loop: wall time against the thread's CPU time.

`policy_ab.py` reports the planner's ms a decode step in the loop; `planner_replay.py` times
the same calls replayed alone. At c = 1 on this CPU the first is several times the second.
This runs `policy_ab.py` with every planner call (plan, observe, observe_host,
observe_period) timed twice: wall clock and `time.thread_time()`, the CPU time of the
calling thread. Wall well above CPU time: the thread waited for a core (the device's work
runs on the same two); CPU time well above the replay's: the same work ran slower beside the
device's.

    python benchmarks/planner_cpu_time.py --workload math --concurrency 1 --num-prompts 32 \
        --repeats 4 static:5 dynamic:7

(every argument is policy_ab.py's; the per-call figures cover every pass, warm-up included)
"""

from __future__ import annotations

import collections
import sys
import time

import policy_ab

CALLS = ("plan", "observe", "observe_host", "observe_period")


def timed(method, label: str, spent: dict):
    """`method` wrapped to add (calls, wall s, thread CPU s) under `label` in `spent`."""
    def call(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            row = spent[label]
            row[0] += 1
            row[1] += time.perf_counter() - wall
            row[2] += time.thread_time() - cpu
    return call


def main(argv: list[str] | None = None) -> int:
    spent = collections.defaultdict(lambda: [0, 0.0, 0.0])

    def time_planner(variant, engine):
        planner = engine.planning.planner
        for name in CALLS if planner is not None else ():
            setattr(planner, name, timed(getattr(planner, name), f"{variant.label} {name}",
                                         spent))

    code = policy_ab.main_with(time_planner, argv)
    print("planner calls, us per call: wall / thread CPU")
    for label, (calls, wall, cpu) in spent.items():
        wall_us, cpu_us = 1e6 * wall / calls, 1e6 * cpu / calls
        print(f"  {label:32s} {calls:6d} calls  {wall_us:7.0f} / {cpu_us:7.0f}")
    return code


if __name__ == "__main__":
    sys.exit(main())
