"""What the multi-device checks share (mesh_check.py, multihost_check.py): the engine
configuration, fixed cost tables, randomised scenarios and a step-API driver.

Import it after setting XLA_FLAGS: it imports jax (through lightspec_jax).
"""

from __future__ import annotations

import os

import jax
import numpy as np

from lightspec_jax import Engine, SamplingParams, SpeculativeConfig

_CACHE = os.environ.get("LIGHTSPEC_TEST_JAX_CACHE",
                        os.path.join(os.path.dirname(__file__), "..", "..", ".jax_cache"))
jax.config.update("jax_compilation_cache_dir", os.path.abspath(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

BASE = dict(dtype="float32", max_num_seqs=4, max_model_len=64, max_num_batched_tokens=16,
            row_buckets=(16,), compilation_cache_dir=None, show_progress=False,
            forbid_recompile=True)
K = 2
COSTS = {"target": {"4": 2.0, "8": 2.6, "12": 3.4}, "draft": {"4": 1e-3, "8": 1e-3, "12": 1e-3},
         "depth": {"1": 0.6, "2": 1.2},
         "profile": {"draft_depth_ms": {"1": 0.6, "2": 1.2}, "context_per_request": 16,
                     "num_slots": 4}}
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)


def policy_config(policy: str, cost_path: str) -> dict:
    if policy == "plain":
        return {}
    spec = SpeculativeConfig(policy=policy, num_speculative_tokens=K)
    if policy == "static":
        return dict(speculative=spec, verify_buckets=(4, 12))
    return dict(speculative=spec, verify_buckets=(4, 8, 12), cost_table_path=cost_path,
                refresh_costs=False)


def scenarios(seed: int, count: int, vocab: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        requests = []
        for i in range(int(rng.integers(3, 7))):
            prompt = rng.integers(2, vocab, size=int(rng.integers(1, 30))).tolist()
            params = SamplingParams(max_tokens=int(rng.integers(2, 20)),
                                    ignore_eos=bool(rng.random() < 0.5))
            requests.append((f"r{i}", prompt, params, int(rng.integers(0, 6))))
        abort = (f"r{int(rng.integers(0, len(requests)))}", int(rng.integers(2, 8)))
        out.append((requests, abort))
    return out


class Recorder:
    """A step observer keeping each decode step's plan and, per slot, the drafts verified and
    the tokens emitted (a slot the step verified emits at least one)."""

    def __init__(self):
        self.plans = []

    def __call__(self, event) -> None:
        if event.readback is not None:
            self.plans.append((event.record.verify_rows, event.record.draft_depth,
                               event.readback[:, event.columns.verified].tolist(),
                               event.readback[:, event.columns.emitted].tolist()))


def serve(engine: Engine, recorder: Recorder, requests, abort):
    """Runs a scenario through the step API -> ({id: (tokens, reason)}, per-step plans)."""
    recorder.plans = []
    pending = sorted(requests, key=lambda r: r[3])
    outputs, added, step = {}, set(), 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][3] <= step:
            rid, prompt, params, _ = pending.pop(0)
            engine.add_request(rid, prompt, params)
            added.add(rid)
        if step == abort[1] and abort[0] in added and abort[0] not in outputs:
            engine.abort(abort[0])
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = (list(out.token_ids), out.finish_reason)
        step += 1
    return outputs, recorder.plans


def recorded(engine: Engine) -> Recorder:
    recorder = Recorder()
    engine.add_step_observer(recorder)
    return recorder


def check_served(label: str, policy: str, got, want, replicas: int = 1) -> None:
    """One scenario served on a layout, (outputs, plans), against the single-device engine's:
    the same tokens and finish reasons (with data parallelism, an aborted request's tokens
    agree as far as both go). Without data parallelism the fill's top-B is global
    over the slots as on one device, so dynamic engines must also make the same plans and
    verify the same rows per slot. With D replicas each verifies its own B / D rows (and the
    slots are spread over the replicas): no replica may use more."""
    (out, plans), (want_out, want_plans) = got, want
    for rid, (tokens, reason) in want_out.items():
        if replicas > 1 and reason == "abort":
            # Replicas prefill their own prompts in their share of the rows, so a prompt may
            # finish a step sooner or later, and an abort at a given step cut it elsewhere:
            # what either emitted is a prefix of the same greedy continuation.
            mine = out.get(rid, ([], None))[0]
            common = min(len(mine), len(tokens))
            check(out.get(rid, (None, None))[1] == "abort" and mine[:common] == tokens[:common],
                  f"{label} {rid}: {out.get(rid)} against {want_out[rid]}")
            continue
        check(out.get(rid) == want_out[rid], f"{label} {rid}: {out.get(rid)} != {want_out[rid]}")
    if replicas > 1:
        for step, (rows, _, verified, emitted) in enumerate(plans):
            used = [(v + 1) * (e > 0) for v, e in zip(verified, emitted)]  # [N] rows per slot
            per = len(used) // replicas
            most = max(sum(used[r * per:(r + 1) * per]) for r in range(replicas))
            check(most <= rows // replicas,
                  f"{label} step {step}: a replica verified {most} rows of {rows} // {replicas}")
    elif policy == "dynamic":
        check(plans == want_plans, f"{label}: plans or verified rows differ from the "
                                   "single-device engine's")
