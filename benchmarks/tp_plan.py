"""Plan tensor parallelism past this machine: Qwen3-32B at TP=8 on H200s, from a CPU.

    python benchmarks/tp_plan.py --out tp_plan.json [--tp 8] [--slots 256]
        [--max-model-len 8192] [--rows 256 1024] [--shape qwen3-32b|tiny] [--no-compile]

Nothing here holds a weight: the target is an abstract module (ShapeDtypeStructs, bf16) and
the engine's own shardings (engine/sharding.py MeshLayout) are applied to it, so

  bytes     per-device parameter and KV-cache bytes come from the shardings' shard shapes
            (mesh_report.shard_bytes), with what is replicated, against the H200's memory;
  export    the engine's decode step (step.decode: fill -> target over B rows -> verify ->
            commit, no drafter) at each verify bucket B is exported with jax.export for CUDA
            over a (1 x TP) mesh of abstract H200 devices (the recipe of
            tests/pallas_kernels/test_cuda_lowering.py, widened to TP devices), with the
            Pallas kernels as a GPU runs them: each device's kernel calls on its own shards,
            under shard_map over 'model' (pallas_kernels.on_local_shards). That StableHLO
            carries the shardings only: GSPMD inserts the collectives when XLA compiles, and
            compiling for a GPU needs one;
  compile   so the same step is also compiled for TP forced CPU devices (same shardings, same
            SPMD partitioner; the jnp reference ops, since the kernels compile for a GPU
            only) and the collectives of the partitioned module are counted, per layer from
            the body of the scan over the layers (mesh_report.hlo_collectives). XLA's GPU
            pipeline may combine or reschedule them, but the partitioner decides how many.

Writes --out (JSON) and prints it.

Axis legend: L layers, H hidden, Q query heads, G KV heads, D head dim, I intermediate,
V vocab, N slots, S cache length, K max draft depth, B verify rows, M model-parallel devices.
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":  # forced host devices (for `compile`) need setting before jax starts
    _tp = int(sys.argv[sys.argv.index("--tp") + 1]) if "--tp" in sys.argv else 8
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={_tp}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import export  # noqa: E402
from flax import nnx  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lightspec_jax.checkpoint import abstract_qwen3  # noqa: E402
from lightspec_jax.engine import step  # noqa: E402
from lightspec_jax.engine.batch import SlotState  # noqa: E402
from lightspec_jax.engine.mesh_report import (hlo_collectives, replicated_bytes,  # noqa: E402
                                              shard_bytes)
from lightspec_jax.engine.sharding import (DATA, MODEL, MeshLayout, leaf_paths,  # noqa: E402
                                           make_mesh)
from lightspec_jax.engine.verifier import ExactMatch  # noqa: E402
from lightspec_jax.models import KVCache, Qwen3Config  # noqa: E402
from lightspec_jax.pallas_kernels import op_routes  # noqa: E402
from lightspec_jax.sampling import SampleMode  # noqa: E402

SHAPES = {
    # Qwen3-32B config.json: untied embeddings, rope theta 1e6, 40960 positions.
    "qwen3-32b": Qwen3Config(vocab_size=151936, hidden_size=5120, intermediate_size=25600,
                             num_layers=64, num_heads=64, num_kv_heads=8, head_dim=128,
                             rope_theta=1_000_000.0, tie_word_embeddings=False,
                             max_position_embeddings=40960),
    # Small enough for a test: 4 query heads over 2 KV heads (repeated at TP=4).
    "tiny": Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=3,
                        num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=False),
}
H200_GB = 141.0  # HBM3e per H200, as NVIDIA lists it (taken as 1e9 bytes per GB: conservative)
GB = 1e9


TRITON_CALL = "__gpu$xla.gpu.triton"  # a Pallas kernel on the Triton route
_TRITON_NAME = re.compile(r'name = "(lightspec_\w+)"')  # the kernel's name in its config
MANUAL_COMPUTATION = "sdy.manual_computation"  # a shard_map region (Shardy)


def h200_mesh(tp: int) -> jax.sharding.AbstractMesh:
    """A (data=1, model=tp) mesh of abstract H200s: lowering for CUDA needs no GPU."""
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132,
                                         platform="gpu")
    return jax.sharding.AbstractMesh((1, tp), (DATA, MODEL), abstract_device=device)


def _placed(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def abstract_engine(cfg: Qwen3Config, mesh, *, num_slots: int, cache_len: int, max_depth: int,
                    dtype=jnp.bfloat16):
    """The decode step's inputs as the engine places them, none allocated: (layout, graphdef,
    treedef, target leaves, KV cache [L, N, S, G*r, D], slot state, verifier inputs)."""
    layout = MeshLayout.for_target(mesh, cfg, num_slots=num_slots)
    graphdef, t_state = nnx.split(abstract_qwen3(cfg, dtype))
    t_leaves = layout.abstract_target(t_state)
    cache = KVCache.abstract(num_layers=cfg.num_layers, num_slots=num_slots, max_len=cache_len,
                             num_kv_heads=layout.kv_heads(cfg), head_dim=cfg.head_dim,
                             dtype=dtype)
    cache = _placed(cache, layout.cache_shardings(cache))
    verifier = ExactMatch()
    state = jax.eval_shape(lambda: SlotState.empty(num_slots, max_depth, verifier.support))
    state = _placed(state, layout.slot_shardings(state, num_slots))
    return layout, graphdef, jax.tree.structure(t_state), t_leaves, cache, state, verifier


def decode_step(graphdef, treedef, verifier, rows: int):
    """The runner's decode executable of bucket `rows` (runner.ModelRunner's decode_fn)
    without a drafter: (t_leaves, d_leaves, cache, dcache, state, extra) -> step outputs."""
    def fn(t_leaves, d_leaves, cache, dcache, state, extra):
        target = nnx.merge(graphdef, jax.tree.unflatten(treedef, t_leaves))
        return step.decode(target, None, verifier, d_leaves, cache, dcache, state, extra,
                           num_rows=rows, mode=SampleMode.GREEDY)
    return fn


def jitted_step(cfg: Qwen3Config, mesh, *, rows: int, **sizes):
    """(jax.jit of the decode step with the runner's donation and out_shardings, its abstract
    arguments) over `mesh` (a Mesh or an AbstractMesh)."""
    layout, graphdef, treedef, t_leaves, cache, state, verifier = abstract_engine(
        cfg, mesh, **sizes)
    fn = decode_step(graphdef, treedef, verifier, rows)
    out_shardings = (layout.cache_shardings(cache), None,
                     layout.slot_shardings(state, state.seq_len.shape[0]),
                     layout.slot_rows, layout.slot_rows)
    jitted = jax.jit(fn, donate_argnames=("cache", "dcache", "state"),
                     out_shardings=out_shardings)
    return jitted, (t_leaves, [], cache, None, state, ())


def memory_plan(cfg: Qwen3Config, *, tp: int, num_slots: int, cache_len: int, max_depth: int,
                workspace_gb: float, mem_fraction: float) -> dict:
    """Per-device bytes at TP=`tp` from the engine's shardings (abstract H200 mesh)."""
    layout, _, _, t_leaves, cache, _, _ = abstract_engine(
        cfg, h200_mesh(tp), num_slots=num_slots, cache_len=cache_len, max_depth=max_depth)
    whole = sum(x.size * x.dtype.itemsize for x in t_leaves)
    replicated = replicated_bytes(t_leaves)
    params = shard_bytes(t_leaves)
    kv = shard_bytes(cache)
    usable = H200_GB * GB * mem_fraction
    per_token = kv // (num_slots * cache_len)  # KV bytes of one slot-token on one device
    free_for_kv = usable - params - workspace_gb * GB
    parts = {}
    for x, name in zip(t_leaves, _leaf_names(cfg)):
        parts[name] = dict(shape=list(x.shape), shard=list(x.sharding.shard_shape(x.shape)),
                           spec=str(x.sharding.spec),
                           bytes_per_device=shard_bytes([x]))
    return dict(
        tp=tp, kv_repeat=layout.kv_repeat, num_slots=num_slots, max_model_len=cache_len,
        param_bytes_whole=whole, param_bytes_per_device=params,
        param_bound=(whole - replicated) // tp + replicated,
        replicated_bytes=replicated,
        replicated=[n for x, n in zip(t_leaves, _leaf_names(cfg))
                    if x.sharding.is_fully_replicated],
        kv_bytes_whole=sum(x.size * x.dtype.itemsize for x in cache),
        kv_bytes_per_device=kv, kv_bytes_per_slot_token_per_device=per_token,
        workspace_allowance_bytes=int(workspace_gb * GB),
        hbm_bytes=int(H200_GB * GB), mem_fraction=mem_fraction, usable_bytes=int(usable),
        total_per_device=params + kv + int(workspace_gb * GB),
        fits=params + kv + workspace_gb * GB <= usable,
        max_model_len_that_fits=int(free_for_kv // (per_token * num_slots)),
        leaves=parts)


def roofline(cfg: Qwen3Config, memory: dict, *, rows: list[int], context: int,
             nvlink_gbs: float, hbm_tbs: float, tflops: float) -> dict:
    """Paper time per layer at TP=M of the two Megatron all-reduces of [B, H] bf16 against the
    per-device weight read (from the shardings), the KV read at `context` tokens per slot and
    the matmul FLOPs, each at its peak (no overlap, no latency term)."""
    m, n = memory["tp"], memory["num_slots"]
    layer_names = [k for k in memory["leaves"] if k.startswith("layers.")]
    weights = sum(memory["leaves"][k]["bytes_per_device"] for k in layer_names) / cfg.num_layers
    kv_read = memory["kv_bytes_per_slot_token_per_device"] * n * context / cfg.num_layers
    link = nvlink_gbs / 2 * GB  # bytes/s each way: a ring sends and receives at once
    out = dict(tp=m, nvlink_bidirectional_gbs=nvlink_gbs, hbm_tbs=hbm_tbs, bf16_tflops=tflops,
               context_per_slot=context, weight_bytes_per_layer_per_device=int(weights),
               weight_read_us=weights / (hbm_tbs * 1e12) * 1e6,
               kv_bytes_per_layer_per_device=int(kv_read),
               kv_read_us=kv_read / (hbm_tbs * 1e12) * 1e6, rows={})
    for b in rows:
        payload = b * cfg.hidden_size * 2  # one all-reduce of [B, H] bf16
        ring = 2 * (m - 1) / m * payload  # sent (and received) per device by a ring
        flops = 2 * b * weights / 2  # 2 FLOPs per bf16 weight (2 bytes) per row
        out["rows"][b] = dict(all_reduce_bytes=payload, ring_bytes_per_device=ring,
                              all_reduce_us=ring / link * 1e6,
                              two_all_reduces_us=2 * ring / link * 1e6,
                              matmul_us=flops / (tflops * 1e12) * 1e6)
    return out


def _leaf_names(cfg: Qwen3Config) -> list[str]:
    return leaf_paths(nnx.split(abstract_qwen3(cfg, jnp.bfloat16))[1])


def export_for_h200(cfg: Qwen3Config, *, tp: int, rows: int, **sizes) -> dict:
    """jax.export of the decode step for CUDA over `tp` abstract H200s, with the Pallas kernels
    (each device's kernels on its own shards, under shard_map over 'model')."""
    mesh = h200_mesh(tp)
    start = time.perf_counter()
    # The kernels as a GPU runs them, compiled, not the CPU's references.
    with jax.sharding.use_abstract_mesh(mesh), op_routes(kernels="compiled"):
        jitted, args = jitted_step(cfg, mesh, rows=rows, **sizes)
        exported = export.export(jitted, platforms=("cuda",), disabled_checks=[
            export.DisabledSafetyCheck.custom_call(TRITON_CALL)])(*args)
    text = exported.mlir_module()
    return dict(rows=rows, seconds=round(time.perf_counter() - start, 2),
                nr_devices=exported.nr_devices, platforms=list(exported.platforms),
                stablehlo_chars=len(text), inputs_split_over_model=_split_inputs(text),
                stablehlo_collectives={op: text.count(f"stablehlo.{op}") for op in
                                       ("all_reduce", "all_gather", "reduce_scatter")},
                triton_kernels=sorted(set(_TRITON_NAME.findall(text))),
                manual_computations=text.count(MANUAL_COMPUTATION))


def _split_inputs(stablehlo: str) -> str:
    """'k of n': the exported main function's arguments whose sharding names 'model'."""
    main = next(line for line in stablehlo.splitlines() if "func.func public @main(" in line)
    args = main.split(") -> (")[0].split("%arg")[1:]
    return f"{sum(MODEL in a for a in args)} of {len(args)}"


def compile_on_host(cfg: Qwen3Config, *, tp: int, rows: int, **sizes) -> dict:
    """The same step compiled for `tp` forced CPU devices: the partitioned module's collectives
    (per layer and in all) and XLA's temporary buffer size per device (CPU backend)."""
    mesh = make_mesh(tensor_parallel_size=tp, data_parallel_size=1)
    start = time.perf_counter()
    jitted, args = jitted_step(cfg, mesh, rows=rows, **sizes)
    compiled = jitted.lower(*args).compile()
    counts = hlo_collectives(compiled.as_text(), trip_count=cfg.num_layers)
    memory = compiled.memory_analysis()
    return dict(rows=rows, seconds=round(time.perf_counter() - start, 2),
                per_layer=counts["loop"], module=counts["module"], shapes=counts["shapes"],
                # Not a GPU figure: XLA:CPU upcasts the bf16 weights for its dots and
                # copies the cache at each scatter into it.
                cpu_temp_bytes=getattr(memory, "temp_size_in_bytes", None))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-32b")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel devices")
    parser.add_argument("--slots", type=int, default=256, help="request slots N (concurrency)")
    parser.add_argument("--max-model-len", type=int, default=8192, help="cache length S")
    parser.add_argument("--max-depth", type=int, default=3,
                        help="max draft depth K: verify buckets reach N (K+1) rows")
    parser.add_argument("--rows", type=int, nargs="+", default=[256, 512, 1024],
                        help="verify buckets B to lower")
    parser.add_argument("--workspace-gb", type=float, default=8.0,
                        help="activation / workspace allowance per device")
    parser.add_argument("--mem-fraction", type=float, default=0.90,
                        help="HBM share JAX may use (XLA_PYTHON_CLIENT_MEM_FRACTION; 0.75 "
                             "unless set)")
    parser.add_argument("--context", type=int, default=2048,
                        help="live tokens per slot for the roofline's KV read")
    parser.add_argument("--nvlink-gbs", type=float, default=900.0,
                        help="NVLink per GPU, both directions together (GB/s)")
    parser.add_argument("--hbm-tbs", type=float, default=4.8, help="HBM bandwidth (TB/s)")
    parser.add_argument("--tflops", type=float, default=989.0,
                        help="dense bf16 matmul peak (TFLOP/s; H100/H200 SXM)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the CPU compile (no collective counts)")
    args = parser.parse_args(argv)
    cfg = SHAPES[args.shape]
    sizes = dict(num_slots=args.slots, cache_len=args.max_model_len, max_depth=args.max_depth)
    out = dict(shape=args.shape, config=cfg.to_hf(), jax=jax.__version__,
               memory=memory_plan(cfg, tp=args.tp, workspace_gb=args.workspace_gb,
                                  mem_fraction=args.mem_fraction, **sizes),
               export=[export_for_h200(cfg, tp=args.tp, rows=b, **sizes) for b in args.rows])
    out["roofline"] = roofline(cfg, out["memory"], rows=args.rows, context=args.context,
                               nvlink_gbs=args.nvlink_gbs, hbm_tbs=args.hbm_tbs,
                               tflops=args.tflops)
    if not args.no_compile:
        out["compile"] = [compile_on_host(cfg, tp=args.tp, rows=b, **sizes) for b in args.rows]
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "config"}, indent=1))
    return out


if __name__ == "__main__":
    main()
