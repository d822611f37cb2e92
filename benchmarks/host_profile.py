"""Where a serving step's host time goes: one serve() under cProfile, per engine step.

The engine records its own host time per step (time in step() not blocked on the device);
this says which functions spend it. One more serve() of the same prompts runs under
cProfile, after the timed one (the engine warm, its planner statistics learnt), and the
functions are reported in ms per engine step, by own time and by cumulative time.
cProfile slows Python-heavy code more than calls into C (a compiled step's dispatch, numpy),
so read shares, not totals; the un-profiled run's host ms is the figure to compare against.

    python benchmarks/host_profile.py --concurrency 256 --policies none static:3 dynamic:7

(the near-free model of host_overhead.py on this CPU). benchmarks/h200_check.py runs the same
profile on the H200's serving engines with --serve-profile.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats

# Functions of the step loop whose cumulative time is always reported (when they ran).
PHASES = ("step", "_run", "plan", "decode", "host_inputs", "_postprocess", "postprocess",
          "_learn", "learn", "_observe", "record", "_output", "schedule")


def profile_serve(engine, prompts, params, *, top: int = 25) -> dict:
    """Serves `prompts` once under cProfile; the top functions in ms per engine step."""
    from spec_serving import serve  # the measurement h200_check and spec_serving report

    before = engine.stats.num_steps
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        row = serve(engine, prompts, params)
    finally:
        profiler.disable()
    steps = max(engine.stats.num_steps - before, 1)
    stats = pstats.Stats(profiler)

    def label(key):
        path, line, name = key
        return f"{os.path.basename(path)}:{line}:{name}" if line else name

    # stats.stats: function key -> (primitive calls, calls, own s, cumulative s, callers)
    entries = [(label(key), calls, own, cum) for key, (_, calls, own, cum, _) in
               stats.stats.items()]
    # This project's own files (lightspec_jax/, models/, planner/ ... under one root).
    import lightspec_jax

    root = os.path.dirname(os.path.dirname(os.path.abspath(lightspec_jax.__file__)))
    ours = {label(key) for key in stats.stats if os.path.abspath(key[0]).startswith(root)}

    def table(index):
        ranked = sorted(entries, key=lambda e: -e[index])[:top]
        return [{"function": f, "calls_per_step": calls / steps,
                 "own_ms_per_step": 1e3 * own / steps, "cum_ms_per_step": 1e3 * cum / steps}
                for f, calls, own, cum in ranked]

    phases = {}
    for f, calls, own, cum in entries:
        name = f.rsplit(":", 1)[-1]
        if name in PHASES and f in ours and calls:
            phases[f] = {"calls_per_step": calls / steps, "cum_ms_per_step": 1e3 * cum / steps}
    return {"steps": steps, "profiled_tok_s": row["tok_s"],
            "profiled_host_ms_per_step": row["host_ms_per_step"],
            "by_own_time": table(2), "by_cumulative_time": table(3),
            "phases": dict(sorted(phases.items(), key=lambda kv: -kv[1]["cum_ms_per_step"]))}


def summary_lines(profile: dict, top: int = 12) -> list[str]:
    """A few lines for a log: the top functions by own time."""
    lines = [f"  profiled {profile['steps']} steps, host {profile['profiled_host_ms_per_step']:.2f}"
             " ms/step under cProfile; own ms/step (cum):"]
    lines += [f"    {e['own_ms_per_step']:7.3f} ({e['cum_ms_per_step']:7.3f}) "
              f"x{e['calls_per_step']:.1f} {e['function']}"
              for e in profile["by_own_time"][:top]]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--policies", nargs="+", default=["none", "static:3", "dynamic:7"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--waves", type=int, default=2, help="requests per slot")
    ap.add_argument("--admission-interval", type=int, nargs="+", default=[1],
                    help="EngineConfig.admission_interval values, each its own engine")
    ap.add_argument("--no-profile", action="store_true",
                    help="only the un-profiled serve (throughput and host ms)")
    ap.add_argument("--out", help="JSON path for the full tables")
    args = ap.parse_args()

    import numpy as np

    from host_overhead import SHAPE, build_engine
    from spec_serving import serve

    from lightspec_jax import SamplingParams

    c = args.concurrency
    rng = np.random.default_rng(c)
    prompts = [rng.integers(1, SHAPE["vocab_size"], size=8).tolist()
               for _ in range(args.waves * c)]
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    results = []
    for policy in args.policies:
        for interval in args.admission_interval:
            engine = build_engine(policy, c, 8 + args.new_tokens + 1,
                                  admission_interval=interval)
            row = serve(engine, prompts, params)
            row.update(policy=policy, c=c, admission_interval=interval,
                       prefill_steps=sum(1 for r in engine.step_records() if r.prefill_rows))
            print(f"{policy} c={c} admission_interval={interval}: host "
                  f"{row['host_ms_per_step']:.2f} ms/step, {row['step_ms']:.2f} ms/step, "
                  f"{row['tok_s']:.0f} tok/s ({_steady(row)})", flush=True)
            if not args.no_profile:
                row["profile"] = profile_serve(engine, prompts, params)
                print("\n".join(summary_lines(row["profile"])), flush=True)
            results.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def _steady(row) -> str:
    """The steady-state figure of a serve() row (spec_serving.QueueWatch), for printing."""
    if row.get("steady_tok_s") is None:
        return "no step ran with requests waiting"
    return f"steady {row['steady_tok_s']:.0f} tok/s over {row['steady_s']:.2f} s"


if __name__ == "__main__":
    main()
