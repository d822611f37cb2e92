"""Serving benchmark: none vs static K=3 vs static K=11 vs dynamic (LightSpec), this CPU.

One run, side by side, per concurrency c: the same requests (random prompts, fixed output
length, EOS ignored) through engines that differ only in policy. The pair is random-weight -
a Qwen3 target (hidden 256, 8 layers, 4/2 heads, head_dim 64, intermediate 768, vocab 8192)
and an Eagle3 drafter for it - so acceptance is SYNTHETIC: drawn from a calibrated workload
profile (planner/synthetic.py; --profile, default chat) instead of exact match; every device
cost is real.

Also measured: the host overhead per speculative step and how much of it the overlapped loop
hides (dynamic run again with overlap off; bare device time from the start-up bucket sweep),
and cold vs warm start (compile + bucket sweep) with an empty vs filled compilation cache.

    python benchmarks/spec_serving.py --concurrency 1 16 64 --profile chat
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np

from spec_static import SHAPE


def make_engine(policy: str, k: int, c: int, args, *, overlap=True, cache_dir=None):
    import jax
    from flax import nnx

    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
    from lightspec_jax.drafters import Eagle3Drafter
    from lightspec_jax.models import Eagle3, Eagle3Config, Qwen3, Qwen3Config

    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
    target_cfg = Qwen3Config(**SHAPE)
    target = Qwen3(target_cfg, rngs=nnx.Rngs(0))
    spec = (SpeculativeConfig() if policy == "none" else
            SpeculativeConfig(policy=policy, num_speculative_tokens=k))
    # Buckets scale with c: c x (1, 1.5, 2, 3, 4, 6, 8, 12) covers every depth up to 11.
    buckets = tuple(sorted({max(1, int(c * f)) for f in (1, 1.5, 2, 3, 4, 6, 8, 12)
                            if c * f <= c * (k + 1)} | {c * (k + 1)})) if k else None
    config = EngineConfig(
        max_num_seqs=c, dtype="float32", speculative=spec, verify_buckets=buckets,
        max_model_len=args.prompt_len + args.new_tokens + 1,
        max_num_batched_tokens=max(128, c), overlap=overlap, show_progress=False,
        compilation_cache_dir=None, synthetic_acceptance=args.profile if k else None)
    drafter = Eagle3Drafter(Eagle3(Eagle3Config.for_target(target_cfg), rngs=nnx.Rngs(1)))
    start = time.perf_counter()
    engine = Engine(target, config=config, drafter=drafter if k else None)
    return engine, time.perf_counter() - start


class QueueWatch:
    """Step observer: (seconds since `start`, tokens its decode step emitted, requests still
    waiting) after every step read back, for the steady-state throughput (`steady`). A
    prompt's first token, sampled by its prefill, is in no step's `emitted`: one token per
    request, alike for every policy."""

    def __init__(self, engine, start: float):
        self.engine, self.start, self.marks = engine, start, []

    def __call__(self, event) -> None:
        self.marks.append((time.perf_counter() - self.start, event.record.emitted,
                           len(self.engine.scheduler.waiting)))

    def steady(self) -> dict:
        """Throughput while requests were still waiting for a slot: every slot a request left
        was refilled, as in a server whose queue never empties. A finite prompt list ends in
        a drain - the last requests finishing with ever fewer beside them - which a fixed
        output length spares plain decoding (its requests end in lockstep) but not a
        speculative policy (its requests end at different steps). Up to the last step read
        while the queue held requests (the start-up ramp included)."""
        queued = [i for i, (_, _, waiting) in enumerate(self.marks) if waiting]
        if not queued:
            return {"steady_tok_s": None, "steady_s": 0.0, "steady_tokens": 0}
        last = queued[-1]
        seconds = self.marks[last][0]
        tokens = sum(emitted for _, emitted, _ in self.marks[:last + 1])
        return {"steady_tok_s": tokens / seconds if seconds > 0 else None,
                "steady_s": seconds, "steady_tokens": tokens}


def serve(engine, prompts, params):
    start = time.perf_counter()
    records = engine.step_records()
    first = records[-1].index if records else 0
    watch = QueueWatch(engine, start)
    engine.add_step_observer(watch)
    try:
        outs = engine.generate(prompts, params)
    finally:
        engine.remove_step_observer(watch)
    wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    window = [r for r in engine.step_records() if r.index > first]
    decodes = [r for r in window if r.verify_rows]
    row = {"tok_s": tokens / wall, "wall_s": wall, "decode_steps": len(decodes),
           "host_ms_per_step": statistics.mean(r.host_ms for r in window),
           "step_ms": 1e3 * wall / max(len(window), 1), **watch.steady()}
    if engine.planner is not None:
        steps = decodes
        m = [o.metrics for o in outs]
        accepted, verified, req_steps = (sum(x.accepted for x in m), sum(x.verified for x in m),
                                         sum(x.steps for x in m))
        row.update(acceptance_rate=accepted / max(verified, 1),
                   acceptance_length=1 + accepted / max(req_steps, 1),
                   verify_rows_per_step=statistics.mean(s.verify_rows for s in steps),
                   used_rows_per_step=statistics.mean(s.used_rows for s in steps),
                   mean_depth=statistics.mean(s.draft_depth for s in steps),
                   spec_steps=len(steps))
    return row


def device_ms(engine, steps) -> float:
    """Bare device time of the executed steps, priced by the start-up bucket sweep."""
    prof = engine.cost_profile
    return sum(prof.target.estimate(s.verify_rows) + prof.draft.estimate(s.verify_rows)
               + prof.draft_depth_ms.get(s.draft_depth, 0.0) for s in steps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--profile", default="chat", choices=("chat", "code", "math"))
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    from lightspec_jax import SamplingParams

    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    policies = [("none", 0), ("static", 3), ("static", 11), ("dynamic", 11)]
    results = {"profile": args.profile, "synthetic_acceptance": True, "rows": [], "overlap": [],
               "startup": {}}
    for c in args.concurrency:
        rng = np.random.default_rng(c)
        prompts = [rng.integers(1, SHAPE["vocab_size"], size=args.prompt_len).tolist()
                   for _ in range(max(4 * c, 8))]
        for policy, k in policies:
            engine, _ = make_engine(policy, k, c, args)
            engine.generate(prompts[:c], params)  # warm-up
            row = serve(engine, prompts, params)
            row.update(c=c, policy="none" if not k else f"{policy} K={k}")
            results["rows"].append(row)
            print(row, flush=True)
            if policy == "dynamic":
                off, _ = make_engine(policy, k, c, args, overlap=False)
                off.generate(prompts[:c], params)
                row_off = serve(off, prompts, params)
                off_steps = [r for r in off.step_records() if r.verify_rows][-row_off["spec_steps"]:]
                t_on = row["wall_s"] / row["spec_steps"] * 1e3
                t_off = row_off["wall_s"] / row_off["spec_steps"] * 1e3
                t_dev = device_ms(off, off_steps) / len(off_steps)
                host = t_off - t_dev
                results["overlap"].append(dict(
                    c=c, step_ms_overlap=t_on, step_ms_serial=t_off, device_ms=t_dev,
                    host_ms=host, hidden_fraction=(t_off - t_on) / host if host > 0 else float("nan"),
                    tok_s_overlap=row["tok_s"], tok_s_serial=row_off["tok_s"]))
                print(results["overlap"][-1], flush=True)
    cold_dir = tempfile.mkdtemp(prefix="lightspec-cold-cache-")
    c = args.concurrency[len(args.concurrency) // 2]
    _, cold = make_engine("dynamic", 11, c, args, cache_dir=cold_dir)
    _, warm = make_engine("dynamic", 11, c, args, cache_dir=cold_dir)
    results["startup"] = {"c": c, "cold_s": cold, "warm_s": warm}

    print(f"\nsynthetic acceptance ({args.profile} profile): device costs real, acceptance drawn")
    print("| c | policy | tok/s | x none | x static K=11 | acceptance rate | acceptance length | "
          "verify rows / step (bucket) | mean next d |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in results["rows"]:
        same = [r for r in results["rows"] if r["c"] == row["c"]]
        none = next(r for r in same if r["policy"] == "none")["tok_s"]
        k11 = next(r for r in same if r["policy"] == "static K=11")["tok_s"]
        spec = (f"{row['acceptance_rate']:.2f} | {row['acceptance_length']:.2f} | "
                f"{row['used_rows_per_step']:.1f} ({row['verify_rows_per_step']:.1f}) | "
                f"{row['mean_depth']:.1f}") if "acceptance_rate" in row else "- | - | - | -"
        print(f"| {row['c']} | {row['policy']} | {row['tok_s']:.0f} | {row['tok_s'] / none:.2f} | "
              f"{row['tok_s'] / k11:.2f} | {spec} |")
    print("\n| c | step ms, overlapped | step ms, serial | bare device ms | host ms | "
          "host hidden by overlap |")
    print("|---|---|---|---|---|---|")
    for o in results["overlap"]:
        print(f"| {o['c']} | {o['step_ms_overlap']:.2f} | {o['step_ms_serial']:.2f} | "
              f"{o['device_ms']:.2f} | {o['host_ms']:.2f} | {100 * o['hidden_fraction']:.0f}% |")
    s = results["startup"]
    print(f"\nstart-up (dynamic K=11, c={s['c']}, compile + bucket sweep): cold cache "
          f"{s['cold_s']:.1f} s, warm cache {s['warm_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
