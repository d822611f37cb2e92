"""Tensor and data parallelism over a jax Mesh (engine/sharding.py).

XLA_FLAGS=--xla_force_host_platform_device_count=8 only takes effect before jax starts, and
the rest of the suite runs on one device in this process, so the multi-device checks run in
one child process (mesh_check.py: engines at TP=2, TP=4, DP=2 and TP=2 x DP=2 against the
single-device ones, the Pallas kernels (interpreted) inside engines at TP=4, DP=2 and TP=2 x DP=2,
each replica's fill on its own slots, the bucket floor of an unbalanced
DP batch, per-device bytes, the collectives and per-device FLOPs of the compiled verify step,
configuration errors), whose JSON summary is checked here. What
needs no second device runs in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lightspec_jax import EngineConfig

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mesh_check.py")


@pytest.mark.slow
@pytest.mark.multidevice
def test_mesh_serving_equals_single_device():
    env = dict(os.environ, JAX_PLATFORMS="cpu",  # the suite's XLA flags (conftest.py), and:
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                          + " --xla_force_host_platform_device_count=8").strip())
    proc = subprocess.run([sys.executable, CHECK], env=env, capture_output=True, text=True,
                          timeout=900)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"mesh_check.py printed nothing (rc {proc.returncode}):\n{proc.stderr[-6000:]}"
    summary = json.loads(lines[-1])
    assert summary["failures"] == [], "\n".join(summary["failures"])
    # The Pallas kernels (interpreted) inside the engine: under tensor parallelism every op's
    # kernel ran per device in a shard_map over 'model'; on one device none was wrapped.
    shard_maps = summary["kernels"]["shard_maps"]
    assert shard_maps["single"] == shard_maps["dp2"] == 0  # DP: per replica, manual already
    assert shard_maps["tp4"] > 0 and shard_maps["tp2xdp2"] > 0
    assert proc.returncode == 0, proc.stderr[-6000:]
    for name, b in summary["bytes"].items():
        # Split parts 1/M on each device, the replicated norms whole; at M > G each device
        # holds one copy of the KV head its query heads read.
        assert b["target_per_device"] <= b["bound"], (name, b)
        assert b["kv_per_device"] == b["kv_placed"] // (b["dp"] * b["tp"]), (name, b)
    for name in ("tp2", "tp4"):
        # Megatron layout: one all-reduce after o_proj and one after down_proj per layer, and
        # no other collective inside the scan over the layers.
        per_layer = summary["hlo"][name]["per_layer"]
        assert per_layer == {**dict.fromkeys(per_layer, 0), "all-reduce": 2}, (name, per_layer)
    hlo = summary["hlo"]
    # Data parallelism splits the work: each replica verifies its own B / D rows against its
    # own slots' KV, prefills its own prompts and drafts for its own slots. At DP=2 the verify
    # and draft steps need no collective at all, the prefill one (its first tokens, gathered
    # for the host), and each device does half the single device's FLOPs (the flat replicated
    # batch did all of them, with an all-reduce per layer to gather the KV of rows whose
    # slots lay on the other replica).
    assert not any(hlo["dp2"]["counts"].values()), hlo["dp2"]
    assert not any(hlo["dp2"]["draft"]["counts"].values()), hlo["dp2"]["draft"]
    assert sum(hlo["dp2"]["prefill"]["counts"].values()) <= 1, hlo["dp2"]["prefill"]
    assert hlo["tp2xdp2"]["per_layer"] == hlo["tp2"]["per_layer"], hlo["tp2xdp2"]
    for name, whole in (("dp2", "single"), ("tp2xdp2", "tp2")):
        for kind in ("decode", "prefill", "draft"):
            got, full = ((hlo[name], hlo[whole]) if kind == "decode" else
                         (hlo[name][kind], hlo[whole][kind]))
            assert 0 < got["flops_per_device"] <= 0.55 * full["flops_per_device"], (
                name, kind, got["flops_per_device"], whole, full["flops_per_device"])
    assert summary["floor_rows"] and set(summary["floor_rows"]) == {4}, summary["floor_rows"]
    tp4 = summary["bytes"]["tp4"]  # 4 devices > 2 KV heads: each head on two devices
    assert tp4["kv_repeat"] == 2 and tp4["kv_heads"] == 4
    assert tp4["kv_per_device"] == tp4["kv_whole"] // 2


def test_defaults_build_no_mesh():
    config = EngineConfig()
    assert not config.uses_mesh and config.mesh is None
    assert (config.tensor_parallel_size, config.data_parallel_size) == (1, 1)


@pytest.mark.parametrize("fields, words", [
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be an int >= 1"),
    (dict(data_parallel_size=1.5), "data_parallel_size must be an int >= 1"),
    (dict(tensor_parallel_size="more than visible"), "devices, but"),
    (dict(mesh="two devices"), "mesh must be a jax.sharding.Mesh"),
])
def test_bad_parallel_config(fields, words):
    if fields.get("tensor_parallel_size") == "more than visible":
        import jax

        fields = dict(tensor_parallel_size=jax.device_count() + 1)
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        EngineConfig(**fields)
