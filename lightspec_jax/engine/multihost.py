"""Serving over several processes (multi-host): the host decisions every process must share.

With `jax.distributed.initialize()` each host runs one process and the same driver program:
the same Engine configuration, the same add_request / abort / step calls in the same order
(the serving front end hands every request to every process). The engine's steps are SPMD
executables over one mesh that spans the processes, so every process must dispatch the same
executable at the same step; one that dispatches another hangs the job (SGLang #31195).

Most host decisions are already the same everywhere: scheduling, draining and the read-back
follow from the requests and the read-back, which every process reads whole (the step
gathers it: MeshLayout.host_rows). Two are not, because they follow measured times:

* whether the start-up cost sweep runs (one process may hold a stored table, another not),
  and the tables themselves;
* the dynamic planner's plan (its statistics price steps by the times each process sees).

So process 0 leads: it decides both and broadcasts them (`Lockstep`); the others follow and
never consult their own timed planner (a static plan follows the requests alone, and each
process makes it). A broadcast is a small collective over every device
(jax.experimental.multihost_utils), once at start-up for the tables and once per decode step
for a timed planner's plan - a host round trip per step that a single process never pays
(1.3 ms on this 2-core CPU with gloo, two processes; tests/engine/multihost_check.py).

Tried on one machine only: two processes with one CPU device each (tests/engine/
test_multihost.py). With two forced CPU devices per process, the CPU runtime now and then hung
in a warm-up step that both processes had dispatched alike (jax 0.10.2, gloo collectives);
with one device per process it did not, in every run so far.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np

from lightspec_jax.planner import StepPlan

# StepPlan's fields, in the order a broadcast plan carries them (numbers as float64: every
# int a plan holds is far below 2**53); then the reason, as 16 character codes.
_PLAN_NUMBERS = ("num_requests", "num_with_proposal", "verified_depth", "fill_rows",
                 "verify_rows", "draft_depth", "update_stats", "full_rows", "predicted_ms",
                 "predicted_tokens")
_REASON_CHARS = 16
assert {f.name for f in dataclasses.fields(StepPlan)} == {*_PLAN_NUMBERS, "reason"}, \
    "a StepPlan field is missing from the broadcast plan"
# Each number back to its field's type (the annotations are strings: postponed evaluation).
_PLAN_TYPES = tuple({"int": int, "bool": bool, "float": float}[str(f.type)]
                    for name in _PLAN_NUMBERS
                    for f in dataclasses.fields(StepPlan) if f.name == name)


def _broadcast(values: np.ndarray) -> np.ndarray:
    """Process 0's `values` on every process (the same shape and dtype everywhere)."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(values))


class Lockstep:
    """Process 0's decisions, shared with the other processes of a multi-host engine."""

    def __init__(self) -> None:
        self.leads = jax.process_index() == 0
        # The broadcast's executable compiles on first use: here, not in a serving step.
        self.plan(StepPlan(num_requests=0, num_with_proposal=0, verified_depth=0, fill_rows=0,
                           verify_rows=0, draft_depth=0, update_stats=False, reason="empty"))

    def flag(self, value: bool) -> bool:
        """Process 0's `value`."""
        return bool(_broadcast(np.array(value, np.bool_)))

    def text(self, value: str | None) -> str:
        """Process 0's `value` (the others pass anything, e.g. None)."""
        data = np.frombuffer((value or "").encode() if self.leads else b"", np.uint8)
        size = int(_broadcast(np.array(len(data), np.int64)))
        buffer = np.zeros(size, np.uint8)
        if self.leads:
            buffer[:] = data
        return _broadcast(buffer).tobytes().decode()

    def plan(self, plan: StepPlan | None) -> StepPlan:
        """Process 0's plan for this step (the others pass None: they do not plan)."""
        codes = np.zeros(len(_PLAN_NUMBERS) + _REASON_CHARS, np.float64)
        if self.leads:
            reason = plan.reason.encode()
            if len(reason) > _REASON_CHARS:
                raise ValueError(f"plan reason {plan.reason!r} is longer than "
                                 f"{_REASON_CHARS} characters")
            codes[:len(_PLAN_NUMBERS)] = [float(getattr(plan, f)) for f in _PLAN_NUMBERS]
            codes[len(_PLAN_NUMBERS):len(_PLAN_NUMBERS) + len(reason)] = list(reason)
        codes = _broadcast(codes)
        fields = {name: kind(x) for name, kind, x in
                  zip(_PLAN_NUMBERS, _PLAN_TYPES, codes[:len(_PLAN_NUMBERS)].tolist())}
        reason = bytes(int(c) for c in codes[len(_PLAN_NUMBERS):] if c).decode()
        return StepPlan(**fields, reason=reason)

    def profile_json(self, data: dict | None) -> dict:
        """Process 0's cost profile (CostProfile.to_json) on every process."""
        return json.loads(self.text(json.dumps(data) if self.leads else None))
