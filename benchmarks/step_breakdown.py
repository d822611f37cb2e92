"""Where a decode step's device time goes: the plain step against the speculative floor.

    python benchmarks/step_breakdown.py OUT_DIR [--dry-run] [--trace]

Builds one random target (Qwen3-0.6B-shaped, bf16, by default; the shipped pair's shape with
--shape shipped; tiny in a dry run) and times, per step, the compiled decode executables that
serving runs at N slots (256) with CTX tokens of live context each, dispatched back to back
(as the overlapped loop does) and waited on once:

    plain            the plain engine's step: no drafter, a 1-wide proposal state (K = 1)
    plain_K          the same step on the speculative engine's K-wide state, no drafter
    floor            the speculative engine's verify step at B = N: aux layers + drafter commit
    floor_no_commit  the same with the drafter's cache writes left out (aux layers kept)
    spec B, d        a verify at B rows, then the draft step of depth d

The differences say what the floor pays over a plain step (the planner's cheapest choice
must cost what plain decoding costs). With --trace each variant also runs three steps under
jax.profiler, and the device kernels per step are summarised from the perfetto trace.
Writes OUT_DIR/step_breakdown.json.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                 num_heads=16, num_kv_heads=8, head_dim=128, tie_word_embeddings=True)
VARIANTS = ("plain", "plain_K", "floor_no_commit", "floor", "spec")
SHIPPED = dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_layers=8,
               num_heads=4, num_kv_heads=2, head_dim=64, tie_word_embeddings=True)  # tiny pair
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=8, num_heads=4,
            num_kv_heads=2, head_dim=32, tie_word_embeddings=True)


def kernel_summary(trace_dir: str, steps: int) -> dict:
    """Device kernels in a perfetto trace: count and total ms per step, the top names."""
    files = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    if not files:
        return {"error": "no perfetto trace written"}
    with gzip.open(files[0]) as f:
        events = json.load(f)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    # Device rows are the tracks whose process name mentions the GPU ("/device:GPU:0").
    pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
            and "device" in str(e.get("args", {}).get("name", "")).lower()}
    kernels = [e for e in events if e.get("ph") == "X" and e.get("pid") in pids]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e["name"][:80], []).append(float(e.get("dur", 0.0)) / 1e3)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:25]
    span = 0.0
    if kernels:
        span = (max(e["ts"] + e.get("dur", 0) for e in kernels)
                - min(e["ts"] for e in kernels)) / 1e3
    return {"kernels_per_step": len(kernels) / steps,
            "kernel_ms_per_step": sum(sum(v) for v in by_name.values()) / steps,
            "span_ms_per_step": span / steps,
            "top": [{"name": k, "count": len(v) / steps, "ms": sum(v) / steps} for k, v in top]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--shape", choices=("qwen3-0.6b", "shipped"), default="qwen3-0.6b",
                    help="target shape (random weights): Qwen3-0.6B or the shipped tiny pair's")
    ap.add_argument("--slots", type=int, default=256, help="N")
    ap.add_argument("--depth", type=int, default=11, help="K")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--trace", action="store_true", help="kernel summary from jax.profiler")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    ap.add_argument("--context", type=int, default=100, help="live tokens per slot")
    ap.add_argument("--only", nargs="+", choices=VARIANTS, default=VARIANTS,
                    help="variants to time (default: all)")
    ap.add_argument("--trace-dir", default=None,
                    help="where jax.profiler writes (default OUT_DIR/traces)")
    ap.add_argument("--keep-traces", nargs="*", default=(), choices=VARIANTS,
                    help="variants whose perfetto trace is copied to OUT_DIR")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from lightspec_jax.drafters import Eagle3Drafter
    from lightspec_jax.engine.costs import _synthetic_state
    from lightspec_jax.engine.runner import ModelRunner
    from lightspec_jax.models import Eagle3, Eagle3Config, Qwen3, Qwen3Config
    from lightspec_jax.models.layers import UNROLL_LAYERS_ENV

    class NoCommit(Eagle3Drafter):
        """Eagle3 whose verify-step cache writes are left out (timing only)."""

        def commit(self, param_leaves, cache, rows, *, tail_row, target_embed):
            return cache

    n, k = (4, 3) if args.dry_run else (args.slots, args.depth)
    dtype = jnp.float32 if args.dry_run else getattr(jnp, args.dtype)
    shape = TINY if args.dry_run else SHIPPED if args.shape == "shipped" else QWEN3_06B
    cfg = Qwen3Config(**shape)
    target = Qwen3(cfg, dtype=dtype, rngs=nnx.Rngs(0))
    eagle = Eagle3(Eagle3Config.for_target(cfg), dtype=dtype, rngs=nnx.Rngs(1))
    cache_len = 16 * -(-(args.context + 2 * args.steps * (k + 1) + 64) // 16)
    results = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
               "xla_flags": os.environ.get("XLA_FLAGS", ""),
               "unroll_layers": os.environ.get(UNROLL_LAYERS_ENV, ""), "slots": n,
               "max_depth": k,
               "context": args.context, "steps": args.steps, "variants": []}

    def runner(drafter, depth, buckets, draft_depths=()):
        start = time.perf_counter()
        r = ModelRunner(target, drafter, num_slots=n, cache_len=cache_len, max_depth=depth,
                        prefill_buckets=(n,), decode_buckets=buckets,
                        draft_depths=draft_depths, show_progress=False)
        return r, time.perf_counter() - start

    def timed(name, r, compile_s, rows, depth):
        extra = r.verifier.empty_inputs(r.num_slots, r.max_depth)

        def run(steps):
            """(ms per step, of which ms per step the host took to dispatch)."""
            r.state = _synthetic_state(r, args.context, n)
            jax.block_until_ready(r.state)
            start = time.perf_counter()
            for _ in range(steps):
                out = r.decode(rows, depth, extra)
            dispatched = time.perf_counter()
            jax.block_until_ready((out, r.state, r.dcache))
            return ((time.perf_counter() - start) * 1e3 / steps,
                    (dispatched - start) * 1e3 / steps)

        run(3)  # warm-up
        ms, dispatch_ms = min(run(args.steps) for _ in range(3))
        # dispatch_ms: the host's time to dispatch a step (on a GPU, launching its kernels);
        # equal to ms when dispatching is the bound.
        row = {"variant": name, "B": rows, "d": depth, "ms_per_step": ms,
               "dispatch_ms_per_step": dispatch_ms, "compile_s": compile_s}
        if args.trace:
            tag = f"{name.replace(' ', '_')}_B{rows}_d{depth}"
            tdir = os.path.join(args.trace_dir or os.path.join(args.out_dir, "traces"), tag)
            with jax.profiler.trace(tdir, create_perfetto_trace=True):
                run(3)
            try:
                row["kernels"] = kernel_summary(tdir, 3)
            except Exception as exc:  # noqa: BLE001 - the timing still counts
                row["kernels"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            found = glob.glob(os.path.join(tdir, "**", "perfetto_trace.json.gz"), recursive=True)
            if name in args.keep_traces and found:
                shutil.copy(found[0], os.path.join(args.out_dir, f"{tag}.json.gz"))
        results["variants"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        with open(os.path.join(args.out_dir, "step_breakdown.json"), "w") as f:
            json.dump(results, f, indent=1)

    if "plain" in args.only:
        timed("plain", *runner(None, 0, (n,)), n, 0)
    if "plain_K" in args.only:
        timed("plain_K", *runner(None, k, (n,)), n, 0)
    if "floor_no_commit" in args.only:
        timed("floor_no_commit", *runner(NoCommit(eagle), k, (n,)), n, 0)
    if "floor" in args.only or "spec" in args.only:
        r, s = runner(Eagle3Drafter(eagle), k, (n, 2 * n), draft_depths=(1, 3))
        if "floor" in args.only:
            timed("floor", r, s, n, 0)
        if "spec" in args.only:
            for rows, depth in ((n, 1), (n, 3), (2 * n, 1)):
                timed("spec", r, 0.0, rows, depth)
    return results


if __name__ == "__main__":
    main()
