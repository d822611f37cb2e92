"""One process of a two-process (multi-host) serving check on this machine's CPU.

tests/engine/test_multihost.py starts two of these with `--process-id 0` and `1`; each calls
jax.distributed.initialize() with the other as its peer (gloo collectives on the CPU) and
holds one CPU device, so the job sees 2 devices over 2 processes - what two hosts with one
accelerator each see. Both processes run the same driver: the same engines, scenarios and
step calls (engine/multihost.py). (Two forced CPU devices per process hung now and then on
this 2-core machine, in steps every process had dispatched alike: see multihost.py.)

Checks, on the shipped tiny pair in float32, over randomised scenarios (prompts, lengths,
staggered arrivals, an abort each):
* plain, static and dynamic engines with data parallelism across the processes (DP=2), the
  dynamic one with fixed cost tables: process 0 checks every output against a single-device
  engine of the same policy it runs on its own, and that no replica verified more than its
  B / 2 rows (both processes must make the same plans: the test compares them); a DSpark-style
  engine (plans from the verified confidences) against plain decoding;
* a dynamic engine with tensor parallelism across the processes (TP=2) with the start-up
  sweep and the online cost refresh - plans that follow each process's measured times - where only process 1 holds a stored cost table: it must sweep
  with process 0 (the sweep's steps are collectives) and take process 0's tables and plans.
Prints one JSON line (its outputs and plans; the test compares the two processes') last.
"""

from __future__ import annotations

import argparse
import faulthandler
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--deadline", type=float, default=600.0,
                        help="seconds before a process that has not finished (a collective "
                             "one process never joined hangs) prints its threads and exits")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    # Process 1 ends first and waits at the shutdown barrier while process 0 computes the
    # single-device references.
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                               num_processes=2, process_id=args.process_id,
                               shutdown_timeout_seconds=int(args.deadline))

    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
    from lightspec_jax.assets import tiny_pair
    from mesh_cases import (BASE, COSTS, K, check, check_served, failures, policy_config,
                            recorded, scenarios, serve)

    leader = args.process_id == 0
    summary: dict = {"process": args.process_id, "devices": jax.device_count(),
                     "local_devices": jax.local_device_count(), "seconds": {}, "served": {}}
    if (jax.process_count(), jax.device_count()) != (2, 2):
        summary["failures"] = [f"{jax.process_count()} processes, {jax.device_count()} "
                               "devices: not 2 and 2"]
        print(json.dumps(summary))
        return 1
    started = time.perf_counter()
    pair = tiny_pair()
    folder = tempfile.mkdtemp()
    fixed = os.path.join(folder, "costs.json")
    with open(fixed, "w") as f:
        json.dump(COSTS, f)
    cases = None

    def served(name: str, config: EngineConfig, policy: str, count: int):
        print(f"process {args.process_id}: {name}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        engine = Engine.from_pretrained(pair.target, None if policy == "plain"
                                        else pair.drafter, config=config)
        nonlocal cases
        cases = cases or scenarios(seed=21, count=2, vocab=engine.model.config.vocab_size)
        recorder = recorded(engine)
        got = [serve(engine, recorder, *case) for case in cases[:count]]
        summary["served"][name] = [[{rid: list(v) for rid, v in out.items()}, plans]
                                   for out, plans in got]
        summary["seconds"][name] = round(time.perf_counter() - t0, 2)
        return got

    # Every process serves the multi-process cases first, together: a process that reached
    # its first collective while the other still compiled single-device references timed
    # out in gloo's connect (a loaded 2-core machine, a fresh compilation cache).
    got = {}
    for policy in ("plain", "static", "dynamic"):
        config = EngineConfig(**BASE, **policy_config(policy, fixed), data_parallel_size=2)
        got[policy] = served(f"dp2/{policy}", config, policy, 2)
    # The DSpark-style policy plans from the verified confidences each process reads back.
    got["dspark"] = served("dp2/dspark", EngineConfig(**BASE, **policy_config("dspark", fixed),
                                                      data_parallel_size=2), "dspark", 1)
    # Timed plans: process 0 holds no stored cost table and sweeps at start-up, process 1
    # holds one; refresh on. Every process must sweep (the sweep's steps are collectives)
    # and plan by process 0's times; only process 0 writes its store.
    stored = os.path.join(folder, "swept.json") if leader else fixed
    config = EngineConfig(**BASE, tensor_parallel_size=2, cost_table_path=stored,
                          refresh_costs=True, verify_buckets=(4, 8, 12),
                          speculative=SpeculativeConfig(policy="dynamic",
                                                        num_speculative_tokens=K))
    got["timed"] = served("tp2/dynamic-timed", config, "dynamic", 1)
    if leader:
        check(os.path.isfile(stored), "process 0 did not store the tables it swept")
    else:
        with open(stored) as f:
            check(json.load(f) == COSTS, "process 1 wrote its cost store")
    # What sharing a plan costs a step (a collective and a host round trip; CPU, gloo).
    from lightspec_jax.engine.multihost import Lockstep
    from lightspec_jax.planner import StepPlan

    lockstep = Lockstep()
    plan = StepPlan(num_requests=4, num_with_proposal=4, verified_depth=2, fill_rows=9,
                    verify_rows=12, draft_depth=1, update_stats=True, reason="probe",
                    full_rows=12, predicted_ms=3.25, predicted_tokens=7.5)
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        shared = lockstep.plan(plan if leader else None)
        times.append(1e3 * (time.perf_counter() - t0))
        check(shared == plan, f"process {args.process_id} received {shared}, not {plan}")
    summary["plan_broadcast_ms"] = round(sorted(times)[len(times) // 2], 3)

    if leader:  # the single-device references, on process 0's first device alone
        t0, want = time.perf_counter(), {}
        for policy in ("plain", "static", "dynamic"):
            config = EngineConfig(**BASE, **policy_config(policy, fixed))
            engine = Engine.from_pretrained(pair.target, None if policy == "plain"
                                            else pair.drafter, config=config)
            recorder = recorded(engine)
            want[policy] = [serve(engine, recorder, *case) for case in cases]
            del engine
        summary["seconds"]["single"] = round(time.perf_counter() - t0, 2)
        for policy in ("plain", "static", "dynamic"):
            for i, served_case in enumerate(got[policy]):
                check_served(f"dp2/{policy} case {i}", policy, served_case, want[policy][i],
                             replicas=2)
        for name, key, ref in (("dp2/dspark", "dspark", "plain"),
                               ("tp2/dynamic-timed", "timed", "dynamic")):
            for out, _ in got[key]:
                for rid, (tokens, reason) in want[ref][0][0].items():
                    if reason != "abort" and out[rid][1] != "abort":  # aborts land by plan
                        check(out[rid] == (tokens, reason), f"{name} {rid} differs from {ref}")
    summary["seconds"]["total"] = round(time.perf_counter() - started, 2)
    summary["failures"] = failures
    print(json.dumps(summary))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
