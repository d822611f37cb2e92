"""The kernel sections of the H200 device check (benchmarks/h200_check.py drives them): the
kernel tests compiled on the GPU, each kernel timed against its reference, and the target verify
step against its bf16 roofline. Each takes the check's Plan; a kernel that fails here joins
`fallback`, the ops the later sections trace on their jnp reference.

Every figure comes with its own roofline: a kernel's is the bytes it must move at least (its
arguments and results; for verify_attention each request's live KV once plus the queries and
the output) over 4.8 TB/s, the step's below. verify_attention is timed on both of its GPU
kernels, Triton and Mosaic GPU.

Target verify step: a random-weight model of the real shape (all layers, bf16, weights drawn on
the device), B verify rows spread evenly over N = 256 slots with a live context of CTX tokens
each; the time is one jitted forward plus argmax over all B rows, next to the roofline
max(bytes / 4.8 TB/s, FLOPs / 790 TFLOP/s) with bytes = weights + KV read, FLOPs = 2 * B *
matmul params + attention. The cache is donated and carried from call to call, as in serving
(without donation every call would copy the whole cache). For Qwen3-14B at some B the same step
is also timed with the XLA attention path, to show what the Pallas attention kernel buys, and
with the Mosaic GPU attention kernel.

Axis legend: N slots, K max draft depth, B verify rows, S cache length, L layers, V vocab.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from h200_check import Plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HBM_BYTES_S = 4.8e12
BF16_FLOPS = 790e12
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


def tree_bytes(*trees) -> int:
    """Bytes of every array in the pytrees."""
    import jax

    return int(sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(trees)))


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

    def add(name, shape, fn, ref=None, extra=None, inputs=(), moved=None):
        """Time fn (and ref). Its roofline is bytes / 4.8 TB/s, with bytes = moved, the least
        the op must read and write, or by default its inputs' and results' bytes."""
        row = {"kernel": name, "shape": shape}
        try:
            out = jax.block_until_ready(fn())
            row["pallas_ms"] = time_call(lambda: jax.block_until_ready(fn()), plan.repeats)
            if ref is not None:
                row["reference_ms"] = time_call(lambda: jax.block_until_ready(ref()),
                                                plan.repeats)
            row["bytes"] = moved if moved is not None else tree_bytes(inputs, out)
            row["roofline_ms"] = row["bytes"] / HBM_BYTES_S * 1e3
            row["fraction_of_roofline"] = row["roofline_ms"] / row["pallas_ms"]
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
            lambda: fill(*args, num_rows=num_rows, impl="reference"), inputs=args)
    fr = fill(conf, plen, active, num_rows=b, impl="reference")
    draft = jnp.asarray(rng.integers(0, 4, (n, k)), jnp.int32)
    target = jnp.asarray(rng.integers(0, 4, (b,)), jnp.int32)
    add("verify", f"N={n} K={k} B={b}", lambda: verify(target, fr, draft, **kw),
        lambda: verify(target, fr, draft, impl="reference"), inputs=(target, fr, draft))
    accepted, out_tokens, num_new = verify(target, fr, draft, impl="reference")
    commit_args = (out_tokens, num_new, accepted, fr, jnp.full((n,), 100, jnp.int32), active,
                   jnp.full((n, 8), -1, jnp.int32), jnp.full((n,), 1000, jnp.int32))
    add("commit", f"N={n} K={k} B={b}", lambda: commit(*commit_args, **kw),
        lambda: commit(*commit_args, impl="reference"), inputs=commit_args)
    # What a fused vocab-argmax + exact-match kernel could save at most: the argmax pass over
    # the verify logits (XLA's reduction), next to the target step that produced them.
    logits = jax.random.normal(jax.random.key(0), (b, plan.vocab), jnp.float32)
    argmax = jax.jit(lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32))
    add("vocab_argmax (XLA)", f"B={b} V={plan.vocab} f32", lambda: argmax(logits), inputs=logits,
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

        shape = (f"B={num_rows} N={n} ctx={plan.context} Q={a['Q']} G={a['G']} D={a['D']} "
                 f"S={a['S']} bf16")
        moved = kv_bytes + 2 * q.nbytes  # each request's live KV once, the queries, the output
        add("verify_attention", shape,
            lambda q=q, slot=slot, pos=pos: verify_attention(q, k_cache, v_cache, slot, pos, **kw),
            extra=extra, moved=moved)
        # The Mosaic GPU kernel of the same op (it never joins the fallback: Triton stays).
        add("verify_attention (Mosaic GPU)", shape,
            lambda q=q, slot=slot, pos=pos: verify_attention(
                q, k_cache, v_cache, slot, pos, impl="mosaic", interpret=plan.dry_run),
            extra=extra, moved=moved)
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
    from lightspec_jax.pallas_kernels import op_routes, use_pallas

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

        def timed(num_rows, ops, mosaic=()):
            """ms of one verify step over num_rows rows, tracing with LIGHTSPEC_REFERENCE_OPS =
            ops and LIGHTSPEC_MOSAIC_OPS = mosaic."""
            per_slot = num_rows // n
            cache = [nnx.merge(graphdef, state).new_cache(num_slots=n, max_len=plan.cache_len)]
            slots = jnp.repeat(jnp.arange(n, dtype=jnp.int32), per_slot)
            positions = plan.context + jnp.tile(jnp.arange(per_slot, dtype=jnp.int32), n)
            tokens = (slots * 7 + positions) % cfg.vocab_size

            def step(state, tokens, positions, slots, cache):  # a fresh trace per call
                out = nnx.merge(graphdef, state)(tokens, positions, slots, cache)
                return jnp.argmax(out.logits, axis=-1), out.cache

            compile_start = time.perf_counter()
            with op_routes(reference=ops, mosaic=mosaic):  # read while tracing
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
                try:  # the same step on the Mosaic GPU attention kernel
                    row["mosaic_attention_ms"] = timed(num_rows, fallback,
                                                       mosaic={"verify_attention"})[0]
                except Exception as exc:  # noqa: BLE001
                    row["mosaic_attention_error"] = last_line(exc)
            rows.append(row)
            publish(results)
            print(name, row, flush=True)
        del state, leaves
        gc.collect()
    return results
