"""Multi-device checks of tensor and data parallelism (engine/sharding.py), run in a fresh
process: the forced CPU device count must be set before jax starts, and the rest of the suite
runs on one device (tests/engine/test_mesh.py launches this file).

On the shipped tiny pair in float32 (target: 4 query heads, 2 KV heads), plain, static and
dynamic engines at TP=2, TP=4 (KV heads replicated), DP=2 and TP=2 x DP=2 (an explicit mesh
on the last four devices) serve the same randomised scenarios (prompts, lengths, staggered
arrivals, an abort) as the single-device engine of the same policy, which must match token
for token, with the same finish reasons. Without data parallelism, the dynamic engines, given
the same cost tables and no online refresh, must also plan the same steps and verify the same
rows per slot (the fill's top-B is global over the slots); with it, no replica may verify
more than its B / D rows. Every engine serves with forbid_recompile. Also: each replica's
fill on its own slots, the n-gram, draft-LM and DFlash drafters at DP=2 against plain
decoding, the draft LM's floor catch-up at DP=2 (its cache current whenever it drafts), seeded
sampling at DP=2 against one device, the Pallas kernels (interpreted, LIGHTSPEC_KERNELS) inside
static engines at TP=4, DP=2 and TP=2 x DP=2 against one device's, from_pretrained reading
each device's slices at TP=2 and (K/V heads repeated) TP=4, from a converted checkpoint too,
the bucket floor of an unbalanced DP batch, per-device bytes against the shardings, the
collectives and per-device FLOPs of the largest verify, prefill and draft steps (per layer:
the body of the scan over the layers), and configuration errors. Those that serve no
single-device reference (bytes, collectives and FLOPs, the fill, the floor, the errors) are in
mesh_probes.py.

Prints one JSON line (the summary) last; exits 1 if any check failed.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig  # noqa: E402
from lightspec_jax.assets import tiny_pair  # noqa: E402
from lightspec_jax.checkpoint import convert_qwen3, load_qwen3, load_qwen3_placed  # noqa: E402
from lightspec_jax.engine.sharding import MODEL, leaf_paths, make_mesh  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from draft_lm_current import serve_checking_current  # noqa: E402
from mesh_cases import (BASE, COSTS, K, check, check_served, failures,  # noqa: E402
                        policy_config, recorded, scenarios, serve)
from mesh_probes import (check_errors, check_fill, check_floor, collectives,  # noqa: E402
                         measure_bytes)

LAYOUTS = {  # name -> EngineConfig fields placing it
    "tp2": dict(tensor_parallel_size=2),
    "tp4": dict(tensor_parallel_size=4),
    "dp2": dict(data_parallel_size=2),
    "tp2xdp2": dict(mesh="last four devices"),
}


def layout_config(name: str) -> dict:
    fields = dict(LAYOUTS[name])
    if fields.get("mesh"):
        fields["mesh"] = make_mesh(tensor_parallel_size=2, data_parallel_size=2,
                                   devices=jax.devices()[4:])
    return fields


def check_floor_catch_up(engine: Engine, plain: Engine) -> dict:
    """A dynamic draft-LM engine at DP=2 drafts nothing for a run of steps (the floor: each
    replica's steps only record their rows), then drafts again: whenever a step drafts, the
    draft model's cache on every replica is current (tests/draft_lm_current.py)."""
    planner, runner = engine.planner, engine.runner
    check(runner.floor_buckets and runner.replicas == 2, "the DP=2 draft-LM engine does not defer")
    decide, calls = planner._next_depth, []

    def scripted(costs, n):  # drafts K, then 5 decisions at the floor, then K again
        decide(costs, n)
        calls.append(n)
        return (0 if 2 <= len(calls) < 7 else K), 0.0

    planner._next_depth, options = scripted, planner.options
    # No probes, and a decision every replan_every steps at the floor too (a grown window
    # would hold the 5 floor decisions past the requests' end).
    planner.options = dataclasses.replace(options, explore_fraction=0.0, replan_limit=None)
    rng = np.random.default_rng(8)
    prompts = {f"floor-{i}": rng.integers(2, 500, size=int(rng.integers(3, 12))).tolist()
               for i in range(4)}
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = dict(zip(prompts, (o.token_ids for o in plain.generate(list(prompts.values()),
                                                                  params))))
    outs, floors, checked = {}, 0, 0
    try:
        outs, floors, checked = serve_checking_current(engine, prompts, ref, params)
    except AssertionError as e:
        check(False, f"dp2/draft_lm floor catch-up: {e}")
    finally:
        planner._next_depth, planner.options = decide, options
    check(outs == ref, "dp2/draft_lm floor run differs from plain decoding")
    check(floors >= 5 and checked >= 8, f"dp2/draft_lm: {floors} floor steps, {checked} "
                                         "slot checks: the scripted floor did not run")
    return {"floor_steps": floors, "slots_checked": checked}


def main() -> int:
    summary: dict = {"devices": jax.device_count(), "seconds": {}, "bytes": {}, "hlo": {}}
    started = time.perf_counter()
    pair = tiny_pair()
    # Fixed cost tables (no start-up sweep, no refresh): every dynamic engine plans alike.
    cost_path = os.path.join(tempfile.mkdtemp(), "costs.json")
    with open(cost_path, "w") as f:
        json.dump(COSTS, f)
    ref = {}
    for policy in ("plain", "static", "dynamic"):
        t0 = time.perf_counter()
        config = EngineConfig(**BASE, **policy_config(policy, cost_path))
        drafter = None if policy == "plain" else pair.drafter
        ref[policy] = Engine.from_pretrained(pair.target, drafter, config=config)
        summary["seconds"][f"single/{policy}"] = round(time.perf_counter() - t0, 2)
    model, drafter = ref["plain"].model, ref["static"].drafter
    cases = scenarios(seed=14, count=3, vocab=model.config.vocab_size)
    want = {}
    for policy, engine in ref.items():
        recorder = recorded(engine)
        want[policy] = [serve(engine, recorder, *case) for case in cases]
    for (plain_out, _), (spec_out, _) in zip(want["plain"], want["static"]):
        for rid, (tokens, reason) in plain_out.items():
            if reason != "abort" and spec_out[rid][1] != "abort":
                check(spec_out[rid] == (tokens, reason), f"single static != plain on {rid}")

    for name in LAYOUTS:
        for policy in ("plain", "static", "dynamic"):
            t0 = time.perf_counter()
            config = EngineConfig(**BASE, **policy_config(policy, cost_path),
                                  **layout_config(name))
            engine = Engine(model, config=config, eos_token_ids=ref[policy].eos_token_ids,
                            drafter=None if policy == "plain" else drafter)
            recorder = recorded(engine)
            for i, case in enumerate(cases):
                check_served(f"{name}/{policy} case {i}", policy,
                             serve(engine, recorder, *case), want[policy][i],
                             replicas=engine.runner.replicas)
            summary["seconds"][f"{name}/{policy}"] = round(time.perf_counter() - t0, 2)
            if policy == "plain":
                summary["bytes"][name] = measure_bytes(name, engine)
            if policy == "static":
                summary["hlo"][name] = collectives(engine)
    summary["hlo"]["single"] = collectives(ref["static"])
    # Every other drafter splits over the replicas too (the n-gram drafter's global hit
    # statistics stay out of the verify step): dynamic at DP=2 equals plain decoding.
    for method, path in (("ngram", None), ("draft_lm", pair.draft_lm), ("dflash", pair.dflash)):
        t0 = time.perf_counter()
        # The n-gram drafter with its shared lookup (the default) and 1-token matches: its hit
        # rates, own and shared, are 2 (max_n + 1) = 4 long, as long as the 4 slots.
        spec = SpeculativeConfig(policy="dynamic", num_speculative_tokens=K,
                                 method="ngram" if path is None else None, ngram_max=1)
        config = EngineConfig(**BASE, **layout_config("dp2"), speculative=spec,
                              verify_buckets=(4, 8, 12), cost_table_path=cost_path,
                              refresh_costs=False)
        engine = Engine.from_pretrained(pair.target, path, config=config)
        if method == "ngram":  # hit rates [4], as long as the 4 slots: still whole
            hits = engine.runner.dcache.hits
            check(hits.shape == (4,) and hits.sharding.is_fully_replicated,
                  f"the n-gram hit rates {hits.shape} were split as per-slot: {hits.sharding}")
        for i, case in enumerate(cases[:2]):
            got_out, _ = serve(engine, recorded(engine), *case)
            for rid, (tokens, reason) in want["plain"][i][0].items():
                if reason != "abort" and got_out[rid][1] != "abort":
                    check(got_out[rid] == (tokens, reason), f"dp2/{method} case {i} {rid} "
                                                            "differs from plain decoding")
        if method == "draft_lm":
            summary["draft_lm_catch_up"] = check_floor_catch_up(engine, ref["plain"])
        summary["seconds"][f"dp2/{method}"] = round(time.perf_counter() - t0, 2)
    # Seeded sampling (draws keyed by seed and position): a dynamic engine at DP=2 equals
    # the single-device plain engine's sampled output.
    t0 = time.perf_counter()
    rng = np.random.default_rng(5)
    prompts = [rng.integers(2, model.config.vocab_size, size=int(rng.integers(3, 30))).tolist()
               for _ in range(6)]
    sampled = [SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.8,
                              top_k=(0, 20)[i % 2], seed=100 + i) for i in range(6)]
    want_sampled = [r.token_ids for r in ref["plain"].generate(prompts, sampled)]
    config = EngineConfig(**BASE, **policy_config("dynamic", cost_path), **layout_config("dp2"))
    engine = Engine(model, config=config, eos_token_ids=ref["dynamic"].eos_token_ids,
                    drafter=drafter)
    got_sampled = [r.token_ids for r in engine.generate(prompts, sampled)]
    check(got_sampled == want_sampled, "dp2/dynamic sampled output differs from one device's")
    summary["seconds"]["dp2/sampled"] = round(time.perf_counter() - t0, 2)
    # The start-up cost sweep and the online refresh on a mesh: plans follow measured times
    # now, so only the outputs must match.
    t0 = time.perf_counter()
    config = EngineConfig(**BASE, **layout_config("tp2xdp2"), speculative=SpeculativeConfig(
        policy="dynamic", num_speculative_tokens=K), verify_buckets=(4, 8, 12))
    engine = Engine(model, config=config, eos_token_ids=ref["dynamic"].eos_token_ids,
                    drafter=drafter)
    got_out, _ = serve(engine, recorded(engine), *cases[0])
    for rid, (tokens, reason) in want["dynamic"][0][0].items():
        if reason != "abort" and got_out[rid][1] != "abort":  # aborts land by plan
            check(got_out[rid] == (tokens, reason), f"tp2xdp2/dynamic-sweep {rid} differs")
    summary["seconds"]["tp2xdp2/dynamic-sweep"] = round(time.perf_counter() - t0, 2)
    # Sharded loading: from_pretrained on a TP=2 mesh reads each device's slices of the
    # safetensors (no whole tensor on the host); the target arrives in the runner's
    # shardings, which place nothing more, and serves as the single-device engine does.
    t0 = time.perf_counter()
    config = EngineConfig(**BASE, **policy_config("static", cost_path), **layout_config("tp2"))
    engine = Engine.from_pretrained(pair.target, pair.drafter, config=config)
    q_proj = engine.model.layers.q_proj[...]
    check(len(q_proj.sharding.device_set) == 2 and not q_proj.sharding.is_fully_replicated,
          f"from_pretrained on tp2 loaded q_proj as {q_proj.sharding}, not split over 2 devices")
    placed = dict(zip(leaf_paths(nnx.state(engine.model)), engine.runner._t_leaves))
    pointers = [[x.data.unsafe_buffer_pointer() for x in a.addressable_shards]
                for a in (placed["layers.q_proj"], q_proj)]
    check(pointers[0] == pointers[1], "the runner copied a target it was given sharded")
    got_out, _ = serve(engine, recorded(engine), *cases[0])
    check(got_out == want["static"][0][0], "tp2 sharded load: output differs from one device")
    summary["seconds"]["tp2/sharded-load"] = round(time.perf_counter() - t0, 2)
    # At TP=4 the target's 2 KV heads are repeated: from_pretrained reads each device the
    # stored head its copy repeats, and the runner places the repeated leaves as they are.
    t0 = time.perf_counter()
    config4 = EngineConfig(**BASE, **policy_config("static", cost_path), **layout_config("tp4"))
    engine4 = Engine.from_pretrained(pair.target, pair.drafter, config=config4)
    k_proj = engine4.model.layers.k_proj[...]
    check(k_proj.shape[2] == 4 and len(k_proj.sharding.device_set) == 4
          and not k_proj.sharding.is_fully_replicated,
          f"from_pretrained on tp4 loaded k_proj {k_proj.shape} as {k_proj.sharding}")
    placed = dict(zip(leaf_paths(nnx.state(engine4.model)), engine4.runner._t_leaves))
    check([x.data.unsafe_buffer_pointer() for x in placed["layers.k_proj"].addressable_shards]
          == [x.data.unsafe_buffer_pointer() for x in k_proj.addressable_shards],
          "the runner copied (or repeated again) K/V heads read repeated")
    got_out, _ = serve(engine4, recorded(engine4), *cases[0])
    check(got_out == want["static"][0][0], "tp4 sharded load: output differs from one device")
    summary["seconds"]["tp4/sharded-load"] = round(time.perf_counter() - t0, 2)
    # A converted (orbax) checkpoint restores into the same shardings: the same arrays, bit
    # for bit, each device's slice read by orbax; the runner places nothing more.
    t0 = time.perf_counter()
    converted = os.path.join(tempfile.mkdtemp(), "converted")
    convert_qwen3(pair.target, converted, dtype="float32")
    restored = Engine.from_pretrained(converted, pair.drafter, config=config)
    q_restored = restored.model.layers.q_proj[...]
    check(q_restored.sharding == q_proj.sharding,
          f"the converted checkpoint restored q_proj as {q_restored.sharding}")
    for a, b in zip(restored.runner._t_leaves, engine.runner._t_leaves):
        check(a.sharding == b.sharding and bool((a == b).all()),
              "a leaf restored from the converted checkpoint differs from the safetensors one")
    check([x.data.unsafe_buffer_pointer() for x in restored.runner._t_leaves[0].addressable_shards]
          == [x.data.unsafe_buffer_pointer()
              for x in jax.tree.leaves(nnx.state(restored.model))[0].addressable_shards],
          "the runner copied a target restored sharded")
    got_out, _ = serve(restored, recorded(restored), *cases[0])
    check(got_out == want["static"][0][0], "tp2 converted load: output differs from one device")
    # Saved in bfloat16, served in float32: cast where each shard lies, as the whole load.
    half = os.path.join(tempfile.mkdtemp(), "converted-bf16")
    convert_qwen3(pair.target, half, dtype="bfloat16")
    _, leaves, _ = load_qwen3_placed(half, restored.runner.layout, dtype="float32")
    whole = jax.tree.leaves(nnx.state(load_qwen3(half, dtype="float32"), nnx.Param))
    for a, b, c in zip(leaves, whole, engine.runner._t_leaves):
        check(a.dtype == b.dtype and a.sharding == c.sharding
              and np.array_equal(np.asarray(a), np.asarray(b)),
              "a bfloat16 converted checkpoint restored sharded as float32 differs")
    summary["seconds"]["tp2/converted-load"] = round(time.perf_counter() - t0, 2)
    # At TP=4 (K/V heads repeated) orbax restores the stored K/V heads whole on each device and
    # they are repeated there: the same placed leaves as read from the safetensors.
    t0 = time.perf_counter()
    restored4 = Engine.from_pretrained(converted, pair.drafter, config=config4)
    for a, b in zip(restored4.runner._t_leaves, engine4.runner._t_leaves):
        check(a.shape == b.shape and a.sharding == b.sharding and bool((a == b).all()),
              f"tp4 converted load: a leaf {a.shape} {a.sharding} differs from the safetensors "
              f"one {b.shape} {b.sharding}")
    got_out, _ = serve(restored4, recorded(restored4), *cases[0])
    check(got_out == want["static"][0][0], "tp4 converted load: output differs from one device")
    summary["seconds"]["tp4/converted-load"] = round(time.perf_counter() - t0, 2)
    summary["kernels"] = check_kernels_on_mesh(model, drafter, ref["static"].eos_token_ids,
                                               cost_path, cases[0])
    summary["fill"] = check_fill()
    summary["floor_rows"] = check_floor(model, ref["plain"].eos_token_ids)
    summary["errors"] = check_errors(model)
    summary["seconds"]["total"] = round(time.perf_counter() - started, 2)
    summary["failures"] = failures
    print(json.dumps(summary))
    return 1 if failures else 0


def check_kernels_on_mesh(model, drafter, eos, cost_path, case) -> dict:
    """The Pallas kernels inside the engine (LIGHTSPEC_KERNELS=interpret: every op's kernel,
    interpreted on this CPU) at TP=4 (KV heads replicated), DP=2 and TP=2 x DP=2 serve as the
    single-device engine with the same kernels. Under tensor parallelism each op runs its
    kernel per device under a shard_map over 'model' (pallas_kernels.on_local_shards): the
    calls are counted as the steps compile."""
    from lightspec_jax.pallas_kernels import op_routes

    t0 = time.perf_counter()
    calls = []
    real_shard_map = jax.shard_map

    def counting(*args, **kwargs):
        if kwargs.get("axis_names") == {MODEL}:
            calls.append(kwargs["in_specs"])
        return real_shard_map(*args, **kwargs)

    jax.shard_map = counting
    try:
        outputs, per_layout = {}, {}
        with op_routes(kernels="interpret"):
            for name in ("single", "tp4", "dp2", "tp2xdp2"):
                config = EngineConfig(**BASE, **policy_config("static", cost_path),
                                      **({} if name == "single" else layout_config(name)))
                before = len(calls)
                engine = Engine(model, config=config, eos_token_ids=eos, drafter=drafter)
                outputs[name], _ = serve(engine, recorded(engine), *case)
                per_layout[name] = len(calls) - before
    finally:
        jax.shard_map = real_shard_map
    for name in ("tp4", "dp2", "tp2xdp2"):
        check(outputs[name] == outputs["single"],
              f"{name} with the Pallas kernels: output differs from one device's")
        # DP alone: each replica's step is manual over the whole mesh already.
        check((per_layout[name] > 0) == (name != "dp2"),
              f"{name}: {per_layout[name]} kernels under a shard_map over 'model'")
    check(per_layout["single"] == 0, "one device: a kernel was wrapped in a shard_map")
    return {"shard_maps": per_layout, "seconds": round(time.perf_counter() - t0, 2)}




if __name__ == "__main__":
    if jax.device_count() != 8:
        print(json.dumps({"failures": [f"{jax.device_count()} devices, not 8: jax started "
                                       "before XLA_FLAGS was set"]}))
        sys.exit(1)
    sys.exit(main())
