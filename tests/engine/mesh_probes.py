"""The multi-device checks of mesh_check.py that serve no single-device reference: what an
engine's devices hold and what its compiled steps communicate and compute (per-device bytes
against the shardings; the collectives and per-device FLOPs of the largest verify, prefill and
draft steps), each data-parallel replica's fill on its own slots, the bucket floor of an
unbalanced DP batch, and configuration errors. mesh_check.py's main() calls them and puts
what they return in its summary; failures go to mesh_cases.check, as there.

Import it after setting XLA_FLAGS (mesh_check.py does): it imports jax.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from lightspec_jax import Engine, EngineConfig, SamplingParams
from lightspec_jax.engine.mesh_report import replicated_bytes, step_report
from lightspec_jax.engine.sharding import MODEL, make_mesh

from mesh_cases import BASE, check, recorded  # tests/engine/: the script's own folder


def measure_bytes(name: str, engine: Engine) -> dict:
    """Per-device target parameter and KV bytes against the whole and the shardings."""
    runner = engine.runner
    m = engine.mesh.shape[MODEL]
    held = runner.device_bytes()
    whole = sum(x.nbytes for x in jax.tree.leaves(nnx.state(engine.model)))  # as loaded
    placed = sum(x.nbytes for x in runner._t_leaves)  # K/V heads repeated when M > G
    replicated = replicated_bytes(runner._t_leaves)  # the RMSNorm weights
    bound = (placed - replicated) / m + replicated
    most = max(held["target"].values())
    check(most <= bound, f"{name}: {most} target bytes on a device > {bound:.0f} bound")
    kv_total = runner.cache.k.nbytes + runner.cache.v.nbytes
    return dict(tp=m, dp=engine.mesh.shape["data"], target_whole=whole, target_placed=placed,
                target_replicated=replicated, target_per_device=most, bound=int(bound),
                kv_whole=2 * runner.cache.k.nbytes // runner.layout.kv_repeat,
                kv_placed=kv_total, kv_per_device=max(held["kv"].values()),
                kv_heads=runner.cache.k.shape[3], kv_repeat=runner.layout.kv_repeat)


def collectives(engine: Engine) -> dict:
    """Collective ops in the largest compiled verify step: in all, in the scan over the
    target's layers (per layer), and the shapes all-gathered; its FLOPs per device; and the
    same counts and FLOPs for the largest prefill step and the deepest draft step."""
    runner = engine.runner

    def largest(registry):
        key = max(registry._compiled, key=lambda k: k[0] if isinstance(k, tuple) else k)
        return step_report(registry._compiled[key], num_layers=engine.model.config.num_layers)

    found = largest(runner.decode_registry)
    out = dict(counts=found["module"], per_layer=found["loop"],
               all_gather_shapes=found["shapes"].get("all-gather", [])[:12],
               flops_per_device=found["flops_per_device"])
    for name, registry in (("prefill", runner.prefill_registry),
                           ("draft", runner.draft_registry)):
        found = largest(registry)
        out[name] = dict(counts=found["module"], flops_per_device=found["flops_per_device"])
    return out


def check_fill() -> str:
    """Each data-parallel replica's fill (a 4 x 2 mesh: four replicas, TP=2 inside) takes its
    top-B/D over its own slots: on every replica, the single-device fill of its slice, with
    slots numbered within it (its row_slot N/D on padding)."""
    from functools import partial

    from jax.sharding import PartitionSpec as P

    from lightspec_jax.engine.scheduler import replica_loads
    from lightspec_jax.engine.sharding import DATA, MeshLayout
    from lightspec_jax.pallas_kernels import fill

    layout = MeshLayout(make_mesh(tensor_parallel_size=2, data_parallel_size=4), kv_repeat=1)
    rng = np.random.default_rng(0)
    n, k, d = 8, 5, 4
    per = n // d
    for trial in range(6):
        conf = rng.random((n, k)).astype(np.float32)
        plen = rng.integers(0, k + 1, n).astype(np.int32)
        active = rng.random(n) < 0.8
        rows = int(replica_loads(active, d).max()) + int(rng.integers(0, per * k // 2 + 1))
        split = jax.jit(layout.per_replica(partial(fill, num_rows=rows), in_specs=(P(DATA),) * 3,
                                           out_specs=P(DATA)))(conf, plen, active)
        for r in range(d):
            mine = slice(r * per, (r + 1) * per)
            one = fill(conf[mine], plen[mine], active[mine], num_rows=rows)
            for name, a, b in zip(one._fields, one, split):
                part = np.asarray(b)[r * len(a):(r + 1) * len(a)]
                check(np.array_equal(np.asarray(a), part),
                      f"fill trial {trial}, replica {r}: {name} differs from its slice's fill")
    return "checked 6 fills on 4 replicas"


def check_floor(model, eos) -> list[int]:
    """Requests land on the least-loaded replica, and the decode bucket gives the busiest one
    a row per request: on DP=2 with four slots, four requests take slots 0, 2, 1, 3; with the
    two on replica 1 aborted, the two left on replica 0 need B = 4 (2 rows each side), though
    plain decoding of two requests alone would pick B = 2. Returns the plans' rows."""
    engine = Engine(model, config=EngineConfig(**BASE, data_parallel_size=2),
                    eos_token_ids=eos)
    recorder = recorded(engine)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"r{i}", [3 + i, 5, 7], params)
    engine.step()
    check([engine.scheduler.running[s].request_id for s in range(4)] == ["r0", "r2", "r1", "r3"],
          f"slots were not spread over the replicas: {engine.scheduler.owner}")
    engine.abort("r1")
    engine.abort("r3")
    recorder.plans = []
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = len(out.token_ids)
    rows = [plan[0] for plan in recorder.plans]
    check({r: outputs.get(r) for r in ("r0", "r2")} == {"r0": 12, "r2": 12},
          f"floor scenario: {outputs}")
    check(bool(rows) and all(r == 4 for r in rows),
          f"two requests on one replica of DP=2 were verified with rows {rows}, not 4")
    return rows


def check_errors(model) -> list[str]:
    """Bad sizes and meshes fail at construction with messages naming the values."""
    seen = []

    def expect(make, *words):
        try:
            make()
        except (ValueError, NotImplementedError) as err:
            msg = str(err)
            check(all(w in msg for w in words), f"error {msg!r} lacks {words}")
            seen.append(msg)
        else:
            check(False, f"no error for {words}")

    small = dict(BASE)
    expect(lambda: EngineConfig(tensor_parallel_size=0), "tensor_parallel_size", "0")
    expect(lambda: EngineConfig(tensor_parallel_size=16), "16 devices", "8 are visible")
    expect(lambda: EngineConfig(data_parallel_size=2, max_num_seqs=3), "max_num_seqs (3)")
    mesh = make_mesh(tensor_parallel_size=2, data_parallel_size=1)
    expect(lambda: EngineConfig(mesh=mesh, tensor_parallel_size=2), "not both")
    other = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    expect(lambda: EngineConfig(mesh=other), "('data', 'model')")
    expect(lambda: Engine(model, config=EngineConfig(**small, tensor_parallel_size=8)),
           "num_heads=4", "num_kv_heads=2")
    expect(lambda: Engine(model, config=EngineConfig(**small, tensor_parallel_size=3)),
           "num_heads=4", "3")
    one_row = dict(small, max_num_batched_tokens=1, row_buckets=(1,))
    expect(lambda: Engine(model, config=EngineConfig(**one_row, data_parallel_size=2)),
           "max_num_batched_tokens (1)", "data parallel size (2)")
    return seen
