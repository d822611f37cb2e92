"""Shared arithmetic of the planners: candidate row counts, draft cost, cost per bucket.

Bucket convention. The planner reasons about the useful row count u (rows the device fills with
real tokens) and pays for the compiled bucket B = smallest bucket >= u. Because a bucket costs
the same however many of its rows are real, the only u worth considering are
u = min(bucket, available) for each bucket from the one holding N up to the one holding
`available`: any other u pays the same bucket for fewer real rows. This is LightLLM's
`keys_between(N, B_max)` (captured sizes in [N, B_max] plus endpoints) adapted to buckets.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from .costs import CostTable
from .types import DrafterKind, PlannerSpec


def candidate_rows(spec: PlannerSpec, num_requests: int, available: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(u, B) pairs worth considering for N requests and `available` fillable rows.

    Returns u: [C] useful rows, ascending, N <= u <= available; B: [C] their buckets.
    """
    buckets = spec.verify_buckets
    lo = bisect.bisect_left(buckets, num_requests)
    hi = bisect.bisect_left(buckets, available)
    chosen = np.asarray(buckets[lo:min(hi, len(buckets) - 1) + 1], dtype=np.int64)  # [C]
    return np.minimum(chosen, available), chosen


def first_best(values: np.ndarray, *, maximize: bool = False) -> int:
    """Index of the first value within rounding (1e-12 relative) of the best one.

    Candidates are ascending in rows or depth, so this keeps the smaller configuration on a
    tie, and a tie that float rounding turns into a last-bit difference still counts as one.
    """
    v = np.asarray(values, dtype=np.float64)
    if maximize:
        best = float(np.max(v))
        return int(np.flatnonzero(v >= best - 1e-12 * abs(best))[0])
    best = float(np.min(v))
    return int(np.flatnonzero(v <= best + 1e-12 * abs(best))[0])


def draft_cost_ms(spec: PlannerSpec, draft: CostTable, *, num_requests: int, verify_rows: int,
                  depth: int, context_len: float | None = None) -> float:
    """Draft time after a verify of `verify_rows` rows, drafting `depth` tokens per request.

    Autoregressive (Eagle3): one forward over the verified rows writes their draft KV and yields
    draft token 1 at each accepted tail; each further depth runs one row per request:
    D(B) + (d-1) D(N). Parallel (block): D(B) + D(N * block_size), the block is one forward.
    (lightspec-algorithm.md §5.)
    """
    if depth < 1:
        raise ValueError(f"draft depth must be >= 1, got {depth}")
    first = draft.estimate(verify_rows, context_len)
    if spec.drafter_kind is DrafterKind.PARALLEL:
        return first + draft.estimate(num_requests * spec.block_size, context_len)
    if depth == 1:
        return first
    return first + (depth - 1) * draft.estimate(num_requests, context_len)


@dataclass(frozen=True, kw_only=True)
class StepCosts:
    """Cost estimates for one plan() call: every bucket priced once at the current context."""

    target_by_bucket: dict[int, float]  # B -> ms of the target verify
    draft_by_bucket: dict[int, float]  # B -> ms of the first draft forward over B rows
    draft_tail: float  # ms of one further depth (autoregressive) or the block (parallel)
    kind: DrafterKind

    @classmethod
    def price(cls, spec: PlannerSpec, target: CostTable, draft: CostTable, *,
              num_requests: int, context_len: float | None) -> StepCosts:
        buckets = spec.verify_buckets
        t = target.estimate_many(buckets, context_len)
        dr = draft.estimate_many(buckets, context_len)
        tail_rows = num_requests * (spec.block_size if spec.drafter_kind is DrafterKind.PARALLEL
                                    else 1)
        return cls(target_by_bucket=dict(zip(buckets, t.tolist())),
                   draft_by_bucket=dict(zip(buckets, dr.tolist())),
                   draft_tail=draft.estimate(max(tail_rows, 1), context_len),
                   kind=spec.drafter_kind)

    def step_ms(self, buckets: np.ndarray, depth: int) -> np.ndarray:
        """Target verify + following draft run for each bucket in `buckets` ([C] -> [C] ms)."""
        t = np.array([self.target_by_bucket[b] + self.draft_by_bucket[b]
                      for b in buckets.tolist()])
        if self.kind is DrafterKind.PARALLEL:
            return t + self.draft_tail
        return t + (depth - 1) * self.draft_tail


def split_draft_ms(spec: PlannerSpec, draft: CostTable, *, measured_ms: float,
                   num_requests: int, verify_rows: int, depth: int,
                   context_len: float | None) -> list[tuple[int, float]]:
    """Attribute a measured draft run to table cells: [(rows, ms of one forward), ...].

    The engine times the draft run as a whole (one event pair around all depths), so the
    measurement is split in proportion to the table's current estimates of its forwards. An
    empty table splits it evenly over the forwards.
    """
    if spec.drafter_kind is DrafterKind.PARALLEL:
        shapes = [(verify_rows, 1), (num_requests * spec.block_size, 1)]
    else:
        shapes = [(verify_rows, 1)] + ([(num_requests, depth - 1)] if depth > 1 else [])
    if draft.is_empty:
        forwards = sum(n for _, n in shapes)
        return [(rows, measured_ms / forwards) for rows, _ in shapes]
    guesses = [draft.estimate(rows, context_len) for rows, _ in shapes]
    total = sum(g * n for g, (_, n) in zip(guesses, shapes))
    scale = measured_ms / total
    return [(rows, g * scale) for g, (rows, _) in zip(guesses, shapes)]
