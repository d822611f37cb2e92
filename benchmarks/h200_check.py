"""One-shot device check on an H200: kernel tests compiled, kernel timings, the target verify
step against its bf16 roofline, and the synthetic-acceptance serving benchmark.

    python benchmarks/h200_check.py OUT_DIR            # on the H200, <= 8 minutes
    python benchmarks/h200_check.py OUT_DIR --dry-run  # same logic on CPU, tiny shapes, < 2 min

Sections run in order and write their results into OUT_DIR/h200_check.json row by row (a later
failure or the time limit keeps what came before); errors are recorded, not raised. A global
deadline skips what would not fit. A kernel that fails its tests or its timing on the GPU is
named in LIGHTSPEC_REFERENCE_OPS for the later sections, so the model and serving figures still
come (on that op's jnp reference, recorded as "reference_ops").

Target verify step: a random-weight model of the real shape (all layers, bf16, weights drawn on
the device), B verify rows spread evenly over N = 256 slots with a live context of CTX tokens
each; the time is one jitted forward plus argmax over all B rows, next to the roofline
max(bytes / 4.8 TB/s, FLOPs / 790 TFLOP/s) with bytes = weights + KV read, FLOPs = 2 * B *
matmul params + attention. The cache is donated and carried from call to call, as in serving
(without donation every call would copy the whole cache). For Qwen3-14B at some B the same step
is also timed with the XLA attention path, to show what the Pallas attention kernel buys.

Axis legend: N slots, K max draft depth, B verify rows, S cache length, L layers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET

# Before jax starts: the kernel-test subprocess and the models share the GPU.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

HBM_BYTES_S = 4.8e12
BF16_FLOPS = 790e12
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
    compare_xla_batches=(256, 3072), vocab=151936, test_workers=4, test_timeout_s=170,
    repeats=10)
DRY_PLAN = Plan(
    dry_run=True, deadline_s=240, test_filter="N4-S64 and f32", slots=4, depth=3,
    attn_shape=dict(Q=4, G=2, D=32, S=64), context=16, cache_len=64, batches=(4, 8),
    models={"qwen3-14b": TINY, "qwen3-0.6b": TINY}, serve_c=4, serve_prompt_len=8,
    serve_new_tokens=8, serve_prefill_tokens=128, serve_shape=TINY, serve_dtype="float32", serve_buckets=(1,),
    serve_waves=2,
    # The same four engines at smaller K: every draft depth up to K compiles and is swept.
    serve_policies=(("static", 5), ("dynamic", 5), ("static", 2), ("none", 0)),
    serve_profile=True, serve_admission_interval=1,
    compare_xla_batches=(4,), vocab=512, test_workers=0,
    test_timeout_s=90, repeats=2)


SECTIONS = ("kernel_tests", "kernel_timings", "verify_step", "serving")
KERNEL_TEST_OPS = {"test_fill": "fill", "test_verify": "verify", "test_commit": "commit",
                   "test_verify_attention": "verify_attention"}


def time_call(fn, repeats: int) -> float:
    """Median ms of fn() (which blocks), after one warm-up call that also compiles."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


@contextlib.contextmanager
def reference_ops(ops):
    """LIGHTSPEC_REFERENCE_OPS = ops while tracing inside the block (read at trace time)."""
    from lightspec_jax.pallas_kernels import REFERENCE_OPS_ENV

    before = os.environ.get(REFERENCE_OPS_ENV)
    os.environ[REFERENCE_OPS_ENV] = ",".join(sorted(ops))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(REFERENCE_OPS_ENV, None)
        else:
            os.environ[REFERENCE_OPS_ENV] = before


def last_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:400] if text else type(exc).__name__


def run_kernel_tests(plan: Plan, out_dir: str, fallback: set) -> dict:
    """pytest over tests/pallas_kernels, compiled on the GPU (interpreted in the dry run).

    The ops whose tests fail join ``fallback`` (their reference serves the later sections).
    """
    report = os.path.join(out_dir, "kernel_tests.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
           os.path.join(ROOT, "tests", "pallas_kernels"), f"--junitxml={report}"]
    if plan.test_filter:
        cmd += ["-k", plan.test_filter]
    if plan.test_workers and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(plan.test_workers)]  # Triton compiles are CPU-bound: spread them
    env = dict(os.environ, LIGHTSPEC_KERNELS_ON_DEVICE="0" if plan.dry_run else "1")
    if not plan.dry_run:
        env["JAX_PLATFORMS"] = "cuda"  # tests/conftest.py defaults the suite to the CPU
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=plan.test_timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"returncode": None, "timed_out": True, "wall_s": time.perf_counter() - start,
                "tail": out[-3000:]}
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    for name in failed:
        module = name.split("::")[0].rsplit(".", 1)[-1]
        if module in KERNEL_TEST_OPS:
            fallback.add(KERNEL_TEST_OPS[module])
    return {"returncode": proc.returncode, "wall_s": time.perf_counter() - start,
            "tests": int(suite.get("tests")), "failures": int(suite.get("failures")),
            "errors": int(suite.get("errors")), "skipped": int(suite.get("skipped")),
            "failed": failed, "tail": proc.stdout[-3000:]}


def time_kernels(plan: Plan, fallback: set, publish) -> list[dict]:
    """Each Pallas kernel vs its reference at the plan's real shapes (ms, median).

    A kernel that fails to compile or run here is recorded and joins ``fallback``.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from lightspec_jax.pallas_kernels import commit, fill, verify, verify_attention

    kw = dict(impl="pallas", interpret=plan.dry_run)
    rng = np.random.default_rng(0)
    n, k, b = plan.slots, plan.depth, plan.slots * (plan.depth + 1)
    conf = jnp.asarray(rng.random((n, k), dtype=np.float32))
    plen = jnp.full((n,), k, jnp.int32)
    active = jnp.ones((n,), bool)
    rows = []

    def add(name, shape, fn, ref=None, extra=None):
        row = {"kernel": name, "shape": shape}
        try:
            row["pallas_ms"] = time_call(lambda: jax.block_until_ready(fn()), plan.repeats)
            if ref is not None:
                row["reference_ms"] = time_call(lambda: jax.block_until_ready(ref()),
                                                plan.repeats)
            row.update(extra(row["pallas_ms"]) if extra else {})
        except Exception as exc:  # noqa: BLE001 - recorded; the reference takes over
            row["error"] = last_line(exc)
            if name in KERNEL_TEST_OPS.values():
                fallback.add(name)
        rows.append(row)
        publish(rows)
        print(row, flush=True)

    for num_rows in sorted({n, b}):
        args = (conf, plen, active)
        add("fill", f"N={n} K={k} B={num_rows}",
            lambda: fill(*args, num_rows=num_rows, **kw),
            lambda: fill(*args, num_rows=num_rows, impl="reference"))
    fr = fill(conf, plen, active, num_rows=b, impl="reference")
    draft = jnp.asarray(rng.integers(0, 4, (n, k)), jnp.int32)
    target = jnp.asarray(rng.integers(0, 4, (b,)), jnp.int32)
    add("verify", f"N={n} K={k} B={b}", lambda: verify(target, fr, draft, **kw),
        lambda: verify(target, fr, draft, impl="reference"))
    accepted, out_tokens, num_new = verify(target, fr, draft, impl="reference")
    commit_args = (out_tokens, num_new, accepted, fr, jnp.full((n,), 100, jnp.int32), active,
                   jnp.full((n, 8), -1, jnp.int32), jnp.full((n,), 1000, jnp.int32))
    add("commit", f"N={n} K={k} B={b}", lambda: commit(*commit_args, **kw),
        lambda: commit(*commit_args, impl="reference"))
    # What a fused vocab-argmax + exact-match kernel could save at most: the argmax pass over
    # the verify logits (XLA's reduction), next to the target step that produced them.
    logits = jax.random.normal(jax.random.key(0), (b, plan.vocab), jnp.float32)
    argmax = jax.jit(lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32))
    add("vocab_argmax (XLA)", f"B={b} V={plan.vocab} f32", lambda: argmax(logits),
        extra=lambda ms: {"logits_bytes": logits.nbytes,
                          "achieved_tb_s": logits.nbytes / (ms * 1e-3) / 1e12})
    del logits

    a = plan.attn_shape
    cache_shape = (n, a["S"], a["G"], a["D"])
    k_cache = jax.random.normal(jax.random.key(1), cache_shape, jnp.bfloat16)
    v_cache = jax.random.normal(jax.random.key(2), cache_shape, jnp.bfloat16)
    for num_rows in plan.batches:
        per_slot = num_rows // n
        slot = jnp.repeat(jnp.arange(n, dtype=jnp.int32), per_slot)  # [B]
        pos = plan.context + jnp.tile(jnp.arange(per_slot, dtype=jnp.int32), n)
        q = jax.random.normal(jax.random.key(3), (num_rows, a["Q"], a["D"]), jnp.bfloat16)
        kv_bytes = 2 * n * (plan.context + per_slot) * a["G"] * a["D"] * 2

        def extra(ms, kv_bytes=kv_bytes):
            return {"kv_bytes": kv_bytes, "kv_roofline_ms": kv_bytes / HBM_BYTES_S * 1e3,
                    "achieved_tb_s": kv_bytes / (ms * 1e-3) / 1e12}

        add("verify_attention", f"B={num_rows} N={n} ctx={plan.context} Q={a['Q']} "
            f"G={a['G']} D={a['D']} S={a['S']} bf16",
            lambda q=q, slot=slot, pos=pos: verify_attention(q, k_cache, v_cache, slot, pos, **kw),
            extra=extra)
    return rows


def verify_step_cost(cfg, num_rows: int, num_slots: int, context: int, param_count: int,
                     itemsize: int) -> tuple[int, int]:
    """(bytes, FLOPs) of one target forward over B rows: weights + KV read, matmuls + attention.

    The input embedding is a gather of B rows, neither read whole nor a matmul - unless it is
    tied, when it is also the [H, V] lm_head.
    """
    embed = cfg.vocab_size * cfg.hidden_size
    matmul_params = param_count - (0 if cfg.tie_word_embeddings else embed)
    kv_token = cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * itemsize  # K and V
    rows_per_slot = num_rows // num_slots
    kv_bytes = num_slots * (context + rows_per_slot) * kv_token
    attn_flops = (4 * num_rows * (context + rows_per_slot) * cfg.num_heads * cfg.head_dim
                  * cfg.num_layers)
    return matmul_params * itemsize + kv_bytes, 2 * num_rows * matmul_params + attn_flops


def time_verify_step(plan: Plan, deadline: float, fallback: set, publish) -> dict:
    import gc

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from lightspec_jax.models import Qwen3, Qwen3Config
    from lightspec_jax.pallas_kernels import use_pallas

    results = {}
    dtype = jnp.float32 if plan.dry_run else jnp.bfloat16
    n = plan.slots
    for model_index, (name, shape) in enumerate(plan.models.items()):
        cfg = Qwen3Config(**shape)
        start = time.perf_counter()
        model = Qwen3(cfg, dtype=dtype, rngs=nnx.Rngs(0))  # drawn leaf by leaf on the device
        graphdef, state = nnx.split(model)
        del model
        leaves = jax.tree.leaves(state)
        param_count, param_bytes = sum(x.size for x in leaves), sum(x.nbytes for x in leaves)
        init_s = time.perf_counter() - start

        def timed(num_rows, ops):
            """ms of one verify step over num_rows rows, tracing with LIGHTSPEC_REFERENCE_OPS."""
            per_slot = num_rows // n
            cache = [nnx.merge(graphdef, state).new_cache(num_slots=n, max_len=plan.cache_len)]
            slots = jnp.repeat(jnp.arange(n, dtype=jnp.int32), per_slot)
            positions = plan.context + jnp.tile(jnp.arange(per_slot, dtype=jnp.int32), n)
            tokens = (slots * 7 + positions) % cfg.vocab_size

            def step(state, tokens, positions, slots, cache):  # a fresh trace per call
                out = nnx.merge(graphdef, state)(tokens, positions, slots, cache)
                return jnp.argmax(out.logits, axis=-1), out.cache

            compile_start = time.perf_counter()
            with reference_ops(ops):
                compiled = jax.jit(step, donate_argnums=(4,)).lower(
                    state, tokens, positions, slots, cache[0]).compile()
                attention = "pallas" if use_pallas(op="verify_attention") else "xla"
            compile_s = time.perf_counter() - compile_start

            def call():  # the same rows rewrite the same cache entries every call
                ids, cache[0] = compiled(state, tokens, positions, slots, cache[0])
                jax.block_until_ready(ids)

            try:
                return time_call(call, plan.repeats), compile_s, attention
            finally:
                del cache[0]

        rows = []
        results[name] = {"config": shape, "dtype": str(jnp.dtype(dtype)), "layers_timed": "all",
                         "slots": n, "context": plan.context, "cache_len": plan.cache_len,
                         "param_bytes": param_bytes, "init_s": init_s, "rows": rows}
        for num_rows in plan.batches:
            if time.perf_counter() > deadline:
                rows.append({"B": num_rows, "skipped": "deadline"})
                continue
            row = {"B": num_rows}
            try:
                ms, compile_s, attention = timed(num_rows, fallback)
            except Exception as exc:  # noqa: BLE001 - retried on the XLA attention path
                if "verify_attention" in fallback:
                    raise
                row["pallas_attention_error"] = last_line(exc)
                fallback.add("verify_attention")
                ms, compile_s, attention = timed(num_rows, fallback)
            bytes_, flops = verify_step_cost(cfg, num_rows, n, plan.context, param_count,
                                             jnp.dtype(dtype).itemsize)
            roofline = max(bytes_ / HBM_BYTES_S, flops / BF16_FLOPS) * 1e3
            row.update(ms=ms, roofline_ms=roofline, fraction_of_roofline=roofline / ms,
                       bytes=bytes_, flops=flops, compile_s=compile_s,
                       attention=attention,
                       bound="memory" if bytes_ / HBM_BYTES_S > flops / BF16_FLOPS
                       else "compute")
            if (model_index == 0 and num_rows in plan.compare_xla_batches
                    and attention == "pallas" and time.perf_counter() < deadline):
                try:
                    row["xla_attention_ms"] = timed(num_rows, fallback | {"verify_attention"})[0]
                except Exception as exc:  # noqa: BLE001
                    row["xla_attention_error"] = last_line(exc)
            rows.append(row)
            publish(results)
            print(name, row, flush=True)
        del state, leaves
        gc.collect()
    return results


def run_serving(plan: Plan, deadline: float, publish) -> list[dict]:
    """Synthetic-acceptance serving (chat profile) at concurrency c: static K=11, dynamic,
    static K=3, none - one shared persistent compile cache, so engines after the first mostly
    load their executables."""
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
    enable_compilation_cache(cache_dir)
    c = plan.serve_c
    target_cfg = Qwen3Config(**plan.serve_shape)
    jdtype = getattr(jnp, plan.serve_dtype)
    params = SamplingParams(max_tokens=plan.serve_new_tokens, ignore_eos=True)
    rng = np.random.default_rng(c)
    prompts = [rng.integers(1, target_cfg.vocab_size, size=plan.serve_prompt_len).tolist()
               for _ in range(plan.serve_waves * c)]
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
            max_model_len=plan.serve_prompt_len + plan.serve_new_tokens + 1,
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
                   new_tokens=plan.serve_new_tokens,
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
            lines.append(f"{row['kernel']:>18} {row['shape']}: FAILED {row['error']}")
            continue
        extra = (f", {row['achieved_tb_s']:.2f} TB/s" if "achieved_tb_s" in row else "")
        extra += (f" (KV roofline {row['kv_roofline_ms']:.3f} ms)" if "kv_roofline_ms" in row
                  else "")
        extra += (f", reference {row['reference_ms']:.3f} ms" if "reference_ms" in row else "")
        lines.append(f"{row['kernel']:>18} {row['shape']}: {row['pallas_ms']:.3f} ms{extra}")
    for name, model in (results.get("verify_step") or {}).items():
        for row in model["rows"]:
            if "ms" in row:
                xla = (f"; XLA attention {row['xla_attention_ms']:.2f} ms"
                       if "xla_attention_ms" in row else "")
                lines.append(f"verify step {name} B={row['B']}: {row['ms']:.2f} ms "
                             f"({row['attention']} attention), roofline {row['roofline_ms']:.2f}"
                             f" ms ({row['bound']}), {100 * row['fraction_of_roofline']:.0f}% of "
                             f"roofline{xla}")
    for row in results.get("serving") or []:
        if "tok_s" in row:
            lines.append(f"serving c={row['c']} {row['policy']}: {row['tok_s']:.0f} tok/s, "
                         f"acceptance length {row.get('acceptance_length', 1):.2f}, "
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
            with reference_ops(fallback):
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
