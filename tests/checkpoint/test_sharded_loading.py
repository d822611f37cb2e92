"""Sharded loading (checkpoint.qwen3.load_qwen3_sharded): each device's shard is read as a
slice of the safetensors tensors and must equal the plain load placed by
MeshLayout.place_target, bit for bit.

Forced CPU devices only take effect before jax starts, so the checks run in one child process
(this file run as a script, 8 devices) that prints a JSON summary; the test reads it. A tiny
random bf16 Qwen3 (8 query heads over 2 KV heads, untied) is written as one file and as a
sharded index, and loaded at TP=2, TP=4 (KV heads repeated) and TP=2 x DP=2, in bf16 and f32.

Axis legend: L layers, H hidden, Q query heads, G KV heads, D head dim, M model devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

LAYOUTS = {"tp2": (2, 1), "tp4": (4, 1), "tp2xdp2": (2, 2)}  # name -> (model, data)
CONFIG = dict(vocab_size=256, hidden_size=32, intermediate_size=96, num_layers=2, num_heads=8,
              num_kv_heads=2, head_dim=8, tie_word_embeddings=False)


def _check(directory: str, mesh_shape: tuple[int, int], dtype: str) -> dict:
    """Loads `directory` both ways over a (data, model) mesh; returns what was read."""
    import jax
    import numpy as np
    from flax import nnx

    from lightspec_jax.checkpoint import load_qwen3
    from lightspec_jax.checkpoint.qwen3 import load_qwen3_sharded
    from lightspec_jax.checkpoint.safetensors_io import TensorReader
    from lightspec_jax.engine.sharding import MeshLayout, leaf_paths, make_mesh

    m, d = mesh_shape
    plain = load_qwen3(directory, dtype=dtype)
    layout = MeshLayout.for_target(make_mesh(tensor_parallel_size=m, data_parallel_size=d),
                                   plain.config, num_slots=4)
    want, want_embed = layout.place_target(nnx.state(plain))

    reads, whole_reads = [], []
    get, get_slice = TensorReader.get, TensorReader.get_slice

    def counting_slice(self, name, index):
        out = get_slice(self, name, index)
        reads.append((name, out.nbytes, int(np.prod(self.shape(name))) * out.itemsize))
        return out

    def counting_get(self, name):
        whole_reads.append(name)
        return get(self, name)

    TensorReader.get_slice, TensorReader.get = counting_slice, counting_get
    try:
        _, got, got_embed = load_qwen3_sharded(directory, layout, dtype=dtype)
    finally:
        TensorReader.get_slice, TensorReader.get = get_slice, get
    failures = []
    for path, a, b in zip(leaf_paths(nnx.state(plain)), want, got):
        if a.shape != b.shape or a.dtype != b.dtype or not a.sharding.is_equivalent_to(
                b.sharding, a.ndim):
            failures.append(f"{path}: {a.shape} {a.dtype} {a.sharding} != "
                            f"{b.shape} {b.dtype} {b.sharding}")
            continue
        for sa, sb in zip(a.addressable_shards, b.addressable_shards):
            x, y = np.asarray(sa.data), np.asarray(sb.data)
            if sa.device != sb.device or x.tobytes() != y.tobytes():
                failures.append(f"{path}: shard on {sa.device} differs")
    if got_embed is not got[leaf_paths(nnx.state(plain)).index("embed")]:
        failures.append("the embedding returned is not the placed embed leaf")
    if not np.array_equal(np.asarray(want_embed), np.asarray(got_embed)):
        failures.append("embedding differs")
    fractions = {}  # HF tensor kind -> the shares of it that single reads took
    for name, nbytes, whole in reads:
        kind = name.split(".")[-2] if name.startswith("model.layers.") else name
        fractions.setdefault(kind, set()).add(round(nbytes / whole, 6))
    return dict(failures=failures, whole_reads=whole_reads,
                bytes_read=sum(n for _, n, _ in reads),
                fractions={k: sorted(v) for k, v in fractions.items()})


def child() -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from lightspec_jax.checkpoint import save_qwen3_hf
    from lightspec_jax.models import Qwen3, Qwen3Config

    out_dir = sys.argv[1]
    model = Qwen3(Qwen3Config(**CONFIG), dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    keys = jax.random.split(jax.random.key(1), len(jax.tree.leaves(state)))
    leaves = [jax.random.normal(k, x.shape, jnp.float32).astype(x.dtype)  # norms too
              for k, x in zip(keys, jax.tree.leaves(state))]
    nnx.update(model, jax.tree.unflatten(jax.tree.structure(state), leaves))
    single, sharded = os.path.join(out_dir, "single"), os.path.join(out_dir, "sharded")
    save_qwen3_hf(model, single)
    save_qwen3_hf(model, sharded, max_shard_bytes=20_000)
    checkpoint_bytes = sum(int(np.prod(x.shape)) * 2 for x in leaves)
    summary = dict(devices=jax.device_count(), checkpoint_bytes=checkpoint_bytes,
                   shards=len([f for f in os.listdir(sharded) if f.endswith(".safetensors")]),
                   runs={})
    for name, mesh_shape in LAYOUTS.items():
        for label, directory in (("single", single), ("sharded", sharded)):
            summary["runs"][f"{name}/{label}/bf16"] = _check(directory, mesh_shape, "bfloat16")
    summary["runs"]["tp4/sharded/f32"] = _check(sharded, LAYOUTS["tp4"], "float32")
    print(json.dumps(summary))
    return 0


@pytest.mark.multidevice
def test_sharded_load_equals_plain_load_placed(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["devices"] == 8 and summary["shards"] > 1
    whole = summary["checkpoint_bytes"]
    for run, got in summary["runs"].items():
        assert got["failures"] == [], (run, got["failures"])
        assert got["whole_reads"] == [], (run, "whole tensors were read")
        m = LAYOUTS[run.split("/")[0]][0]
        for kind, shares in got["fractions"].items():
            assert shares == [round(read_share(kind, m), 6)], (run, kind, shares)
        # Each distinct shard is read once (over 'data' too); at M > G the devices holding
        # copies of one KV head each read it.
        copies = max(m // CONFIG["num_kv_heads"], 1)
        assert got["bytes_read"] == whole + (copies - 1) * kv_proj_bytes(), (run, got, whole)


def read_share(kind: str, m: int) -> float:
    """The share of an HF tensor one read takes at M model devices: a norm whole, one
    device's 1/M of a split tensor, of K/V one head of G (or 1/M) heads."""
    if kind.endswith("norm") or kind.endswith("layernorm") or kind == "model.norm.weight":
        return 1.0
    if kind in ("k_proj", "v_proj"):
        return 1 / min(m, CONFIG["num_kv_heads"])
    return 1 / m


def kv_proj_bytes() -> int:
    """k_proj and v_proj [L, H, G, D] in bf16."""
    c = CONFIG
    return 2 * c["num_layers"] * c["hidden_size"] * c["num_kv_heads"] * c["head_dim"] * 2


if __name__ == "__main__":
    sys.exit(child())
