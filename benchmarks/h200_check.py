"""One-shot device check on an H200: kernel tests compiled, kernel timings, the target verify
step against its bf16 roofline, and the synthetic-acceptance serving benchmark.

    python benchmarks/h200_check.py OUT_DIR            # on the H200, <= 8 minutes
    python benchmarks/h200_check.py OUT_DIR --dry-run  # same logic on CPU, tiny shapes, < 2 min

Sections run in order and write their results into OUT_DIR/h200_check.json row by row (a later
failure or the time limit keeps what came before); errors are recorded, not raised. A global
deadline skips what would not fit. A kernel that fails its tests or its timing on the GPU is
named in LIGHTSPEC_REFERENCE_OPS for the later sections, so the model and serving figures still
come (on that op's jnp reference, recorded as "reference_ops").

The kernel sections (kernel tests, kernel timings, the verify step against its roofline) are
in benchmarks/h200_kernels.py; the serving section and the driver are here.

Axis legend: N slots, K max draft depth, B verify rows, S cache length, L layers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

# Before jax starts: the kernel-test subprocess and the models share the GPU.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from h200_kernels import (last_line, run_kernel_tests,  # noqa: E402
                          time_kernels, time_verify_step)

QWEN3_14B = dict(vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_layers=40,
                 num_heads=40, num_kv_heads=8, head_dim=128, tie_word_embeddings=False)
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                 num_heads=16, num_kv_heads=8, head_dim=128, tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=8, num_heads=4,
            num_kv_heads=2, head_dim=32, tie_word_embeddings=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """What one run measures: the H200 plan or the CPU dry run."""

    dry_run: bool
    deadline_s: float
    test_filter: str | None  # pytest -k for the kernel tests (None: all of them)
    slots: int  # N
    depth: int  # K
    attn_shape: dict  # verify_attention timing: Q, G, D, S
    context: int  # live tokens per slot in the verify-step timing
    cache_len: int  # S of the verify-step cache
    batches: tuple[int, ...]  # B
    models: dict  # name -> Qwen3Config fields
    serve_c: int
    serve_prompt_len: int
    serve_new_tokens: int
    serve_prefill_tokens: int  # max_num_batched_tokens: a wave's prompts in a step or two
    serve_shape: dict
    serve_dtype: str
    serve_buckets: tuple[float, ...]  # verify buckets as multiples of c (plus c * (K+1))
    serve_waves: int  # prompts = waves * c: each slot serves this many requests in turn
    serve_policies: tuple[tuple[str, int], ...]  # in run order: K=11 first fills the compile
    # cache that dynamic (same buckets) and K=3 (a subset) then reuse
    serve_profile: bool  # each engine serves once more under cProfile (host_profile.py)
    serve_admission_interval: int  # EngineConfig.admission_interval of the serving engines
    # r: each request's max_tokens uniform in new_tokens x [1 - r, 1 + r] (0: all alike, and
    # plain decoding's requests end in lockstep)
    serve_length_spread: float
    compare_xla_batches: tuple[int, ...]  # B where the first model is also timed on XLA attention
    vocab: int  # V of the vocab-argmax timing
    test_workers: int  # pytest-xdist workers for the kernel tests (0: in-process)
    test_timeout_s: float
    repeats: int


SERVE_POLICIES = (("static", 11), ("dynamic", 11), ("static", 3), ("none", 0))
H200_PLAN = Plan(
    dry_run=False, deadline_s=420, test_filter=None, slots=256, depth=11,
    attn_shape=dict(Q=40, G=8, D=128, S=4096), context=512, cache_len=1024,
    batches=(256, 512, 1024, 2048, 3072), models={"qwen3-14b": QWEN3_14B, "qwen3-0.6b": QWEN3_06B},
    serve_c=256, serve_prompt_len=32, serve_new_tokens=128, serve_prefill_tokens=8192,
    serve_shape=QWEN3_06B,
    serve_dtype="bfloat16", serve_buckets=(1, 2, 4, 8), serve_waves=2,
    serve_policies=SERVE_POLICIES, serve_profile=False, serve_admission_interval=1,
    serve_length_spread=0.0,
    compare_xla_batches=(256, 3072), vocab=151936, test_workers=4, test_timeout_s=170,
    repeats=10)
DRY_PLAN = Plan(
    dry_run=True, deadline_s=240, test_filter="N4-S64 and f32", slots=4, depth=3,
    attn_shape=dict(Q=4, G=2, D=64, S=64), context=16, cache_len=64, batches=(4, 8),
    models={"qwen3-14b": TINY, "qwen3-0.6b": TINY}, serve_c=4, serve_prompt_len=8,
    serve_new_tokens=8, serve_prefill_tokens=128, serve_shape=TINY, serve_dtype="float32", serve_buckets=(1,),
    serve_waves=2,
    # The same four engines at smaller K: every draft depth up to K compiles and is swept.
    serve_policies=(("static", 5), ("dynamic", 5), ("static", 2), ("none", 0)),
    serve_profile=True, serve_admission_interval=1, serve_length_spread=0.5,
    compare_xla_batches=(4,), vocab=512, test_workers=0,
    test_timeout_s=90, repeats=2)


SECTIONS = ("kernel_tests", "kernel_timings", "verify_step", "serving")


def output_lengths(new_tokens: int, spread: float, count: int, rng) -> list[int]:
    """Each request's max_tokens: uniform integers in new_tokens x [1 - spread, 1 + spread]
    (at least 1), all new_tokens at spread 0."""
    lo = max(1, round(new_tokens * (1.0 - spread)))
    hi = max(lo, round(new_tokens * (1.0 + spread)))
    return rng.integers(lo, hi + 1, size=count).tolist()


def run_serving(plan: Plan, deadline: float, publish) -> list[dict]:
    """Synthetic-acceptance serving (chat profile) at concurrency c: static K=11, dynamic,
    static K=3, none - one shared persistent compile cache, so engines after the first mostly
    load their executables."""
    import atexit
    import shutil
    import tempfile

    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from host_profile import profile_serve, summary_lines
    from spec_serving import serve  # the same measurement as benchmarks/spec_serving.py

    from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
    from lightspec_jax.engine.buckets import enable_compilation_cache
    from lightspec_jax.drafters import Eagle3Drafter
    from lightspec_jax.models import Eagle3, Eagle3Config, Qwen3, Qwen3Config

    cache_dir = tempfile.mkdtemp(prefix="lightspec_h200_check_")
    # The engines below share it; nothing reads it after this process (each dry run of the
    # test suite left one behind).
    atexit.register(shutil.rmtree, cache_dir, ignore_errors=True)
    enable_compilation_cache(cache_dir)
    c = plan.serve_c
    target_cfg = Qwen3Config(**plan.serve_shape)
    jdtype = getattr(jnp, plan.serve_dtype)
    rng = np.random.default_rng(c)
    prompts = [rng.integers(1, target_cfg.vocab_size, size=plan.serve_prompt_len).tolist()
               for _ in range(plan.serve_waves * c)]
    lengths = output_lengths(plan.serve_new_tokens, plan.serve_length_spread, len(prompts),
                             rng)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    rows = []
    for policy, k in plan.serve_policies:
        label = policy if policy == "none" else f"{policy} K={k}"
        if time.perf_counter() > deadline:
            rows.append({"c": c, "policy": label, "skipped": "deadline"})
            publish(rows)
            continue
        start = time.perf_counter()
        target = Qwen3(target_cfg, dtype=jdtype, rngs=nnx.Rngs(0))
        drafter = Eagle3Drafter(Eagle3(Eagle3Config.for_target(target_cfg), dtype=jdtype,
                                       rngs=nnx.Rngs(1)))
        # Fewer buckets than spec_serving: each costs start-up compile time and sweep.
        buckets = tuple(sorted({max(1, int(c * f)) for f in plan.serve_buckets if f <= k + 1}
                               | {c * (k + 1)}))
        config = EngineConfig(
            max_num_seqs=c, dtype=plan.serve_dtype, verify_buckets=buckets,
            speculative=SpeculativeConfig(policy=policy, num_speculative_tokens=max(k, 1)),
            max_model_len=plan.serve_prompt_len + max(lengths) + 1,
            max_num_batched_tokens=plan.serve_prefill_tokens, show_progress=False,
            admission_interval=plan.serve_admission_interval,
            compilation_cache_dir=cache_dir, synthetic_acceptance="chat")
        try:
            engine = Engine(target, config=config, drafter=drafter if policy != "none" else None)
            startup_s = time.perf_counter() - start
            row = serve(engine, prompts, params)
        except Exception as exc:  # noqa: BLE001 - recorded; the next policy still runs
            row = {"error": last_line(exc)}
            traceback.print_exc()
            startup_s = time.perf_counter() - start
        else:
            row.update(step_diagnostics(engine))
            if plan.serve_profile:
                row["host_profile"] = profile_serve(engine, prompts, params)
                print("\n".join([label] + summary_lines(row["host_profile"])), flush=True)
        row.update(c=c, policy=label, startup_s=startup_s, profile="chat",
                   admission_interval=plan.serve_admission_interval,
                   prompts=len(prompts), prompt_len=plan.serve_prompt_len,
                   new_tokens=plan.serve_new_tokens, length_spread=plan.serve_length_spread,
                   target=("qwen3-0.6b-shaped" if not plan.dry_run else "tiny") + " random")
        rows.append(row)
        publish(rows)
        print(row, flush=True)
        engine = target = drafter = None
    return rows


def step_diagnostics(engine) -> dict:
    """Where a serving run's time went: steps by (bucket, depth) with their median wall, host
    and wait ms, next to the start-up sweep's device-cost table and the planner's tables after
    the run. Host ms is the loop's own time per step (not blocked on the device); wall ms per
    step over device ms is the loop's tax (goal: <= 1.15 at c=256)."""
    import statistics

    out = {}
    records = [r for r in engine.step_records() if r.verify_rows]
    if records:
        groups = {}
        for r in records:
            groups.setdefault((r.verify_rows, r.draft_depth), []).append(r)
        out["steps_by_bucket_depth"] = [
            {"B": b, "d": d, "steps": len(rs),
             "median_ms": statistics.median(r.seconds * 1e3 for r in rs),
             "median_host_ms": statistics.median(r.host_ms for r in rs),
             "median_wait_ms": statistics.median(r.wait_ms for r in rs)}
            for (b, d), rs in sorted(groups.items())]
        out["host_ms_per_step"] = statistics.median(r.host_ms for r in records)
        out["wait_ms_per_step"] = statistics.median(r.wait_ms for r in records)
    if engine.cost_profile is not None:
        out["sweep"] = engine.cost_profile.summary()
    for name in ("target_costs", "draft_costs", "depth_costs"):
        table = getattr(engine.planner, name, None)
        if table is not None and hasattr(table, "rows"):
            out[f"planner_{name}_after"] = {b: table.estimate(b) for b in table.rows}
    return out


def summary_text(results: dict) -> str:
    lines = [f"h200_check ({'dry run, CPU' if results['dry_run'] else 'H200'}) "
             f"jax {results['env'].get('jax')} backend {results['env'].get('backend')} "
             f"devices {results['env'].get('devices')} XLA_FLAGS "
             f"{results['env'].get('xla_flags')!r}"]
    t = results.get("kernel_tests") or {}
    if "tests" in t:
        lines.append(f"kernel tests: {t['tests']} run, {t['failures']} failed, {t['errors']} "
                     f"errors, {t['skipped']} skipped ({t['wall_s']:.0f} s)")
        lines += [f"  FAILED {name}" for name in t["failed"][:20]]
    elif t.get("timed_out"):
        lines.append(f"kernel tests: timed out after {t['wall_s']:.0f} s")
    if results.get("reference_ops"):
        lines.append(f"ops on their jnp reference after GPU failures: {results['reference_ops']}")
    for row in results.get("kernel_timings") or []:
        if "error" in row:
            lines.append(f"{row['kernel']:>28} {row['shape']}: FAILED {row['error']}")
            continue
        extra = (f", {row['achieved_tb_s']:.2f} TB/s" if "achieved_tb_s" in row else "")
        extra += (f" (KV roofline {row['kv_roofline_ms']:.3f} ms)" if "kv_roofline_ms" in row
                  else "")
        extra += (f", {100 * row['fraction_of_roofline']:.1f}% of its roofline"
                  if "fraction_of_roofline" in row else "")
        extra += (f", reference {row['reference_ms']:.3f} ms" if "reference_ms" in row else "")
        lines.append(f"{row['kernel']:>28} {row['shape']}: {row['pallas_ms']:.3f} ms{extra}")
    for name, model in (results.get("verify_step") or {}).items():
        for row in model["rows"]:
            if "ms" in row:
                xla = (f"; XLA attention {row['xla_attention_ms']:.2f} ms"
                       if "xla_attention_ms" in row else "")
                xla += (f"; Mosaic GPU attention {row['mosaic_attention_ms']:.2f} ms"
                        if "mosaic_attention_ms" in row else "")
                xla += (f"; Mosaic GPU attention FAILED {row['mosaic_attention_error']}"
                        if "mosaic_attention_error" in row else "")
                lines.append(f"verify step {name} B={row['B']}: {row['ms']:.2f} ms "
                             f"({row['attention']} attention), roofline {row['roofline_ms']:.2f}"
                             f" ms ({row['bound']}), {100 * row['fraction_of_roofline']:.0f}% of "
                             f"roofline{xla}")
    for row in results.get("serving") or []:
        if "tok_s" in row:
            steady = row.get("steady_tok_s")  # while requests waited (spec_serving.QueueWatch)
            steady = "" if steady is None else f" (steady {steady:.0f})"
            lines.append(f"serving c={row['c']} {row['policy']}: {row['tok_s']:.0f} tok/s"
                         f"{steady}, acceptance length {row.get('acceptance_length', 1):.2f}, "
                         f"rows/step {row.get('used_rows_per_step', 0):.0f}, "
                         f"start-up {row['startup_s']:.0f} s")
        elif "error" in row:
            lines.append(f"serving c={row['c']} {row['policy']}: FAILED {row['error']}")
    for name, err in results["errors"].items():
        lines.append(f"ERROR in {name}: {err.strip().splitlines()[-1] if err else ''}")
    if "total_s" in results:
        lines.append(f"total {results['total_s']:.0f} s; sections "
                     + ", ".join(f"{k} {v:.0f} s" for k, v in results["section_s"].items()
                                 if v is not None))
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, interpret mode, tiny shapes (a test of this script)")
    parser.add_argument("--serve-policies", nargs="+", metavar="POLICY:K",
                        help="serving policies in run order (default: static:11 dynamic:11 "
                             "static:3 none:0)")
    parser.add_argument("--serve-buckets", nargs="+", type=float, metavar="F",
                        help="serving verify buckets as multiples of c (default 1 2 4 8; "
                             "0.25 0.5 add the buckets of a filling or draining batch)")
    parser.add_argument("--serve-waves", type=int,
                        help="requests per slot (prompts = waves * c; default 2)")
    parser.add_argument("--serve-profile", action="store_true",
                        help="each serving engine serves once more under cProfile: where its "
                             "host time goes (always on in the dry run)")
    parser.add_argument("--serve-admission-interval", type=int, metavar="STEPS",
                        help="EngineConfig.admission_interval of the serving engines "
                             "(default 1: admit every step)")
    parser.add_argument("--serve-length-spread", type=float, metavar="R",
                        help="each request's max_tokens uniform in new_tokens x [1-R, 1+R] "
                             "(default 0: every request emits as many, so plain decoding's end "
                             "together)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=SECTIONS,
                        help="run only these sections (a rerun after a fix)")
    parser.add_argument("--deadline-s", type=float,
                        help="override the plan's deadline (seconds from the start)")
    args = parser.parse_args(argv)
    plan = DRY_PLAN if args.dry_run else H200_PLAN
    if args.deadline_s is not None:
        plan = dataclasses.replace(plan, deadline_s=args.deadline_s)
    if args.serve_policies:
        policies = tuple((p.split(":")[0], int(p.split(":")[1]) if ":" in p else 0)
                         for p in args.serve_policies)
        plan = dataclasses.replace(plan, serve_policies=policies)
    if args.serve_buckets:
        plan = dataclasses.replace(plan, serve_buckets=tuple(args.serve_buckets))
    if args.serve_waves:
        plan = dataclasses.replace(plan, serve_waves=args.serve_waves)
    if args.serve_profile:
        plan = dataclasses.replace(plan, serve_profile=True)
    if args.serve_admission_interval:
        plan = dataclasses.replace(plan, serve_admission_interval=args.serve_admission_interval)
    if args.serve_length_spread is not None:
        if not 0.0 <= args.serve_length_spread < 1.0:
            parser.error("--serve-length-spread must be in [0, 1), got "
                         f"{args.serve_length_spread}")
        plan = dataclasses.replace(plan, serve_length_spread=args.serve_length_spread)
    os.makedirs(args.out_dir, exist_ok=True)
    start = time.perf_counter()
    deadline = start + plan.deadline_s
    results = {"dry_run": plan.dry_run, "env": {}, "kernel_tests": None, "kernel_timings": None,
               "verify_step": None, "serving": None, "reference_ops": [], "errors": {},
               "section_s": {}}
    fallback: set[str] = set()  # ops whose GPU kernel failed here

    def save():
        results["reference_ops"] = sorted(fallback)
        with open(os.path.join(args.out_dir, "h200_check.json"), "w") as f:
            json.dump(results, f, indent=2, default=str)
        with open(os.path.join(args.out_dir, "summary.txt"), "w") as f:
            f.write(summary_text(results))

    def publisher(name):
        def publish(partial):
            results[name] = partial
            save()
        return publish

    sections = [
        # First, while this process holds no GPU memory.
        ("kernel_tests", lambda: run_kernel_tests(plan, args.out_dir, fallback)),
        ("kernel_timings", lambda: time_kernels(plan, fallback, publisher("kernel_timings"))),
        ("verify_step", lambda: time_verify_step(plan, deadline, fallback,
                                                 publisher("verify_step"))),
        ("serving", lambda: run_serving(plan, deadline, publisher("serving"))),
    ]
    for name, section in sections:
        if name not in args.only:
            results["section_s"][name] = None  # not asked for in this run
            continue
        if name != "kernel_tests" and not results["env"]:
            import jax

            results["env"] = {"jax": jax.__version__, "backend": jax.default_backend(),
                              "devices": [d.device_kind for d in jax.devices()],
                              "xla_flags": os.environ.get("XLA_FLAGS", ""),
                              "unroll_layers": os.environ.get("LIGHTSPEC_UNROLL_LAYERS", "")}
        section_start = time.perf_counter()
        try:
            # Later sections trace with the failed kernels' references.
            from lightspec_jax.pallas_kernels import op_routes

            with op_routes(reference=fallback):
                results[name] = section()
        except Exception:  # noqa: BLE001 - recorded, and the next section still runs
            results["errors"][name] = traceback.format_exc()
            print(results["errors"][name], file=sys.stderr, flush=True)
        results["section_s"][name] = time.perf_counter() - section_start
        save()
    results["total_s"] = time.perf_counter() - start
    save()
    print(summary_text(results), end="")
    return results


if __name__ == "__main__":
    main()
