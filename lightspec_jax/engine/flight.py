"""A dispatched engine step and what its read-back gives the step observers (host only).

Engine.step dispatches step i+1 before reading step i back (`overlap`), so one step is in
flight between two step() calls: InFlight holds what reading it back needs (its device
arrays, the slot owners and the plan at dispatch); StepEvent is what the read-back reports.

Axis legend: N slots, K max draft depth, C prompt chunks sampled by the step's prefill.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lightspec_jax.planner import StepPlan

from ..metrics import StepRecord


@dataclasses.dataclass(frozen=True)
class StepEvent:
    """What a step observer receives once a step has been read back."""

    record: StepRecord
    plan: StepPlan | None  # the decode step's plan (None: prefill only)
    readback: np.ndarray | None  # [N, K+1+5] per-slot results, columns `columns`
    columns: object  # batch.Readback


@dataclasses.dataclass
class InFlight:
    """A dispatched engine step whose results have not been read yet."""

    owners: list  # slot -> request at dispatch
    completing: list  # requests whose first token the prefill samples, in sample order
    first_tokens: object  # device [C] or None
    first_index: np.ndarray | None  # where each completing request's token is in first_tokens
    readback: object  # device [N, K+1+5] or None
    confidence: object  # device [N, K] or None
    plan: StepPlan | None
    with_proposal: np.ndarray  # [N] bool: slots a draft run gave a proposal, at dispatch
    prefill_rows: int
    prefill_ms: float  # host ms the step spent dispatching its slot writes and prompt chunks
    context_len: int
    busy_at_enqueue: bool
    dispatched_at: float
