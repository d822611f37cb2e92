"""benchmarks/tp_plan.py: planning tensor parallelism from abstract arrays (no weights).

The byte accounting and the CUDA export need no devices (an AbstractMesh of H200s), so they
run in this process; counting the collectives needs a compile for TP devices, so the script
itself runs once in a child with forced CPU devices.

Axis legend: L layers, H hidden, Q query heads, G KV heads, D head dim, M model-parallel
devices, N slots, S cache length.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "tp_plan.py")
_spec = importlib.util.spec_from_file_location("tp_plan", SCRIPT)
tp_plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tp_plan)

NORMS = {"input_norm", "post_norm", "q_norm", "k_norm", "norm"}
SIZES = dict(num_slots=8, cache_len=64, max_depth=3)


def whole_bytes(cfg) -> tuple[int, int]:
    """(the target as loaded, its K/V projections [L, H, G, D] x 2), in bf16."""
    _, state = tp_plan.nnx.split(tp_plan.abstract_qwen3(cfg, tp_plan.jnp.bfloat16))
    whole = sum(x.size * 2 for x in jax.tree.leaves(state))
    return whole, 2 * cfg.num_layers * cfg.hidden_size * cfg.num_kv_heads * cfg.head_dim * 2


@pytest.mark.parametrize("shape, tp", [("tiny", 1), ("tiny", 2), ("tiny", 4),
                                       ("qwen3-32b", 8)])
def test_bytes_per_device_from_shardings(shape, tp):
    cfg = tp_plan.SHAPES[shape]
    plan = tp_plan.memory_plan(cfg, tp=tp, workspace_gb=0.0, mem_fraction=0.9, **SIZES)
    whole, kv_proj = whole_bytes(cfg)
    repeat = max(tp // cfg.num_kv_heads, 1)  # M > G: each device keeps the KV head it reads
    replicated = plan["replicated_bytes"]
    if tp > 1:  # on one device everything counts as replicated
        assert {name.split(".")[-1] for name in plan["replicated"]} == NORMS
    assert plan["param_bytes_whole"] == whole + (repeat - 1) * kv_proj
    # Split parts 1/M on each device, the norms whole: exactly, as every split divides.
    bound = (whole + (repeat - 1) * kv_proj - replicated) // tp + replicated
    assert plan["param_bytes_per_device"] <= whole // tp + replicated + (repeat - 1) * kv_proj // tp
    assert plan["param_bytes_per_device"] == bound
    kv_heads = cfg.num_kv_heads * repeat // tp  # [L, N, S, G*r/M, D] per device, K and V
    n, s = SIZES["num_slots"], SIZES["cache_len"]
    assert plan["kv_bytes_per_device"] == 2 * cfg.num_layers * n * s * kv_heads * cfg.head_dim * 2


def test_qwen3_32b_fit_at_tp8():
    """c=256 at 8192 tokens fits an H200 (90% usable, 8 GB workspace); 16384 does not."""
    cfg = tp_plan.SHAPES["qwen3-32b"]
    fit = dict(tp=8, num_slots=256, max_depth=3, workspace_gb=8.0, mem_fraction=0.9)
    short = tp_plan.memory_plan(cfg, cache_len=8192, **fit)
    assert short["param_bytes_per_device"] == 8_191_715_328  # 65.5 GB / 8 + the norms
    assert short["kv_bytes_per_device"] == 64 * 1024**3  # 256 x 8192 x 64 layers x 32 KiB/8
    assert short["fits"] and 8192 <= short["max_model_len_that_fits"] < 16384
    assert not tp_plan.memory_plan(cfg, cache_len=16384, **fit)["fits"]


def test_decode_step_exports_for_h200s():
    """The engine's decode step exports for CUDA over 4 abstract H200s on a one-CPU machine;
    the StableHLO carries the shardings, GSPMD adds the collectives when XLA compiles. Every
    Pallas kernel of the step is in it, each in its own shard_map region over 'model' (GSPMD
    cannot split a kernel's custom call): fill, the target's attention (all layers: one call
    in the scan's body), verify, commit."""
    got = tp_plan.export_for_h200(tp_plan.SHAPES["tiny"], tp=4, rows=16, **SIZES)
    assert got["nr_devices"] == 4 and got["platforms"] == ["cuda"]
    # 9 split target parameters (all but the 5 norms) and the K and V caches.
    assert got["inputs_split_over_model"].startswith("11 of ")
    assert not any(got["stablehlo_collectives"].values())
    assert got["triton_kernels"] == ["lightspec_commit_tokens", "lightspec_fill_layout",
                                     "lightspec_fill_select", "lightspec_verify",
                                     "lightspec_verify_attention"]
    assert got["manual_computations"] == 4


@pytest.mark.multidevice
def test_script_counts_two_all_reduces_per_layer(tmp_path):
    out = tmp_path / "plan.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--out", str(out), "--shape", "tiny", "--tp", "4",
         "--slots", "8", "--max-model-len", "64", "--rows", "8", "16"],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    plan = json.loads(out.read_text())
    assert [c["rows"] for c in plan["compile"]] == [8, 16]
    for bucket in plan["compile"]:
        # Megatron layout: after o_proj and after down_proj, nothing else in a layer.
        per_layer = bucket["per_layer"]
        assert per_layer == {**dict.fromkeys(per_layer, 0), "all-reduce": 2}, bucket
        # Outside the layers: the vocab-split embedding's all-reduce, the argmax's gathers.
        assert bucket["module"]["all-reduce"] == 3, bucket
    roof = plan["roofline"]["rows"]
    assert np.isclose(roof["16"]["all_reduce_bytes"], 16 * 64 * 2)
