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
import math
from dataclasses import dataclass

import numpy as np

from .costs import CostTable
from .survival import pooled, weighted_line
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
                  depth: int, context_len: float | None = None,
                  depth_costs: CostTable | None = None) -> float:
    """Draft time after a verify of `verify_rows` rows, drafting `depth` tokens per request.

    Autoregressive (Eagle3): one forward over the verified rows writes their draft KV and yields
    draft token 1 at each accepted tail; each further depth runs one row per request:
    D(B) + (d-1) D(N). Parallel (block): D(B) + D(N * block rows), the block is one forward
    (spec.block_rows: the whole block, or the drafts and the bonus row of one cut to d).
    (lightspec-algorithm.md §5.)

    depth_costs: the measured drafting stage that follows the first forward, ms by depth d (an
    engine that compiles drafting per depth times it directly). When given it replaces the
    formula's tail: D(B) + S(d). The formula prices each further depth as one more forward like
    the first, over N rows; an engine that runs the depths as one compiled loop over its slots
    pays neither the first forward's input work (feature projection) nor a dispatch per depth,
    so the formula can overprice deep drafts several-fold (see benchmarks/diagnose_dynamic.py).
    """
    if depth < 1:
        raise ValueError(f"draft depth must be >= 1, got {depth}")
    first = draft.estimate(verify_rows, context_len)
    if depth_costs is not None and not depth_costs.is_empty:
        return first + depth_costs.estimate(depth, context_len)
    if spec.drafter_kind is DrafterKind.PARALLEL:
        return first + draft.estimate(num_requests * spec.block_rows(depth), context_len)
    if depth == 1:
        return first
    return first + (depth - 1) * draft.estimate(num_requests, context_len)


@dataclass(frozen=True, kw_only=True)
class StepCosts:
    """Cost estimates for one plan() call: every bucket priced once at the current context.

    A step's price is its wall time in the serving loop: the device's work (target verify,
    drafter commit forward, drafting) and the host's (scheduling, planning, reading back,
    building outputs). The loop overlaps the two, more or less: a step costs max(device, host)
    + exposed * min(device, host), with `exposed` 0 where the smaller hides entirely and 1 where
    they add up (learned online: calibration.HostOverlap). Host time follows the
    number of requests and whether the step drafts (a second dispatch, more bookkeeping), not
    rows or depth: a host-bound step (host > device) makes extra verify rows free, and the
    planner should take them.
    """

    target_by_bucket: dict[int, float]  # B -> ms of the target verify
    draft_by_bucket: dict[int, float]  # B -> ms of the first draft forward over B rows
    draft_tail: float  # ms of one further depth (autoregressive)
    # d -> ms of the drafting stage after the first forward: measured, or a parallel drafter's
    # block forward; None: (d - 1) * draft_tail
    stage_by_depth: dict[int, float] | None = None
    host_ms: float = 0.0  # host ms of a step with this many requests (0: not measured)
    host_draft_ms: float | None = None  # the same for a step that drafts (None: as host_ms)
    exposed: float = 0.0  # share of min(device, host) added to the larger (0: hidden)

    def __post_init__(self) -> None:
        # The same prices as arrays, for device_ms_grid (plan() reads them every step):
        # buckets [Bk] ascending, verify and first-draft ms [Bk], the stage after it by depth.
        buckets = np.array(sorted(self.target_by_bucket), dtype=np.int64)
        depths = max(self.stage_by_depth or (0,))
        object.__setattr__(self, "_arrays", (
            buckets,
            np.array([self.target_by_bucket[b] for b in buckets.tolist()]),
            np.array([self.draft_by_bucket[b] for b in buckets.tolist()]),
            None if self.stage_by_depth is None else np.array(
                [self.stage_by_depth.get(d, np.nan) for d in range(depths + 1)])))

    @classmethod
    def price(cls, spec: PlannerSpec, target: CostTable, draft: CostTable, *,
              num_requests: int, context_len: float | None,
              depth_costs: CostTable | None = None, host_costs: CostTable | None = None,
              host_draft_costs: CostTable | None = None, exposed: float = 0.0,
              linear_depth: bool = False) -> StepCosts:
        """linear_depth: price an autoregressive drafter's stage on the line through its
        measured depths (_depth_line) rather than depth by depth."""
        buckets = spec.verify_buckets
        t = _never_cheaper(target, buckets, context_len)
        dr = _never_cheaper(draft, buckets, context_len)
        stage = None
        every = tuple(range(1, spec.max_depth + 1))  # a proposal may be capped off the grid
        if depth_costs is not None and not depth_costs.is_empty:
            fit = _depth_line if (linear_depth and spec.drafter_kind is
                                  DrafterKind.AUTOREGRESSIVE) else _never_cheaper
            stage = dict(zip(every, fit(depth_costs, every, context_len)))
            stage[0] = 0.0
        elif spec.drafter_kind is DrafterKind.PARALLEL:  # the block forward, by its rows
            stage = {d: draft.estimate(max(num_requests * spec.block_rows(d), 1), context_len)
                     for d in every}
            stage[0] = 0.0
        host = 0.0
        if host_costs is not None and not host_costs.is_empty and num_requests > 0:
            host = _host_ms(host_costs, num_requests)
        host_draft = None
        if host_draft_costs is not None and not host_draft_costs.is_empty and num_requests > 0:
            host_draft = _host_ms(host_draft_costs, num_requests)
            if host > 0.0:
                # A floor step's host work is a drafting step's minus the draft dispatch, so
                # it never costs more. The floor is visited rarely (nothing probes it), and one
                # slow step() priced it several-fold over drafting for a whole run (math,
                # c=64: 9.9 ms against 2.7).
                host = min(host, host_draft)
        return cls(target_by_bucket=dict(zip(buckets, t)),
                   draft_by_bucket=dict(zip(buckets, dr)),
                   draft_tail=draft.estimate(max(num_requests, 1), context_len),
                   stage_by_depth=stage, host_ms=host,
                   host_draft_ms=host_draft, exposed=exposed)

    def device_ms(self, bucket: int, depth: int) -> float:
        """device_ms_grid() of one (bucket, depth), in floats: the loop prices each period's
        step with it."""
        verify = self.target_by_bucket[bucket]  # a KeyError for a bucket not priced
        if depth <= 0:
            return verify + 0.0
        if self.stage_by_depth is None:
            tail = (depth - 1) * self.draft_tail
        else:
            tail = self.stage_by_depth.get(depth, math.nan)
        return verify + (self.draft_by_bucket[bucket] + tail)

    def depth_ms(self, depth: int) -> float:
        """The draft run's part after its first forward: the measured stage, (d-1) further
        forwards (autoregressive) or the block forward (parallel); nothing at depth 0."""
        return float(self._stage_ms(np.array([depth]))[0])

    def _stage_ms(self, depths: np.ndarray) -> np.ndarray:
        """depth_ms for each depth: [D] -> [D] ms."""
        stage_ms = self._arrays[3]
        tail = (np.maximum(depths - 1, 0) * self.draft_tail if stage_ms is None
                else stage_ms[depths])
        return np.where(depths > 0, tail, 0.0)

    def host(self, drafts=False) -> np.ndarray:
        """Host ms of steps that draft (`drafts`: a bool or bools) or not."""
        draft_host = self.host_ms if self.host_draft_ms is None else self.host_draft_ms
        return np.where(drafts, draft_host, self.host_ms)

    def wall(self, device_ms: np.ndarray, drafts=False) -> np.ndarray:
        """Loop ms of steps whose device work takes `device_ms` (any shape); `drafts` (a bool,
        or bools broadcasting against device_ms): the steps run a draft stage."""
        host = self.host(drafts)
        return np.maximum(device_ms, host) + self.exposed * np.minimum(device_ms, host)

    def step_ms(self, buckets: np.ndarray, depth: int) -> np.ndarray:
        """Wall ms of a verify of each bucket plus the following draft run ([C] -> [C]).
        At depth 0, the floor, the drafter runs no forward (it only writes its cache)."""
        return self.step_ms_grid(buckets, np.array([depth]))[0]

    def step_ms_grid(self, buckets: np.ndarray, depths: np.ndarray) -> np.ndarray:
        """step_ms for every (depth, bucket) pair: [D] x [C] -> [D, C] ms."""
        return self.wall(self.device_ms_grid(buckets, depths), (depths > 0)[:, None])

    def device_ms_grid(self, buckets: np.ndarray, depths: np.ndarray) -> np.ndarray:
        """The device's part of step_ms_grid: verify, then the draft run ([D] x [C] -> [D, C])."""
        every, verify_ms, first_ms, _ = self._arrays
        at = np.searchsorted(every, buckets)  # [C]
        if (at >= len(every)).any() or (every[np.minimum(at, len(every) - 1)] != buckets).any():
            raise KeyError(f"buckets {buckets} are not all priced ({every.tolist()})")
        depths = np.asarray(depths)
        tail = self._stage_ms(depths)  # [D]
        drafts = (depths > 0)[:, None]  # [D, 1]
        return verify_ms[at][None, :] + np.where(drafts, first_ms[at][None, :] + tail[:, None],
                                                 0.0)


def _never_cheaper(table: CostTable, keys: tuple[int, ...], context_len: float | None
                   ) -> list[float]:
    """[K] the table's ms at `keys` (rows or depths, ascending), made non-decreasing: more
    rows, or a deeper draft, never cost less. The online refresh can say otherwise: it splits
    each measured step over the cells that ran in it, so a cell the planner rarely chooses
    keeps its few samples, and one slow or fast one misprices it for a whole run, never
    chosen (or always chosen) to be corrected. On the tiny pair at math c=1 the refreshed
    tables priced the depth-3 stage at 4.8 ms against 4.5 for depth 4, and 8 verify rows
    below 4 at a short context. Violating cells are pooled, weighted by their samples (the
    PAVA fit the survival uses, survival.py), so a well-measured cell moves least."""
    ms, counts = table.read_many(keys, context_len)  # [K] each
    if not any(b < a for a, b in zip(ms, ms[1:])):  # nothing to pool (most calls)
        return ms
    return [-v for v in pooled([-v for v in ms], [float(c) for c in counts])]


def _depth_line(table: CostTable, depths: tuple[int, ...], context_len: float | None
                ) -> list[float]:
    """[K] an autoregressive draft stage's ms at `depths` on the weighted least-squares line
    a + b d through the table's cells (weights: their samples; b >= 0). The stage is a loop of
    d alike forwards, so its cost is a line in d; cell by cell, the start-up sweep's single
    samples are not: on the tiny pair (ShareGPT, c=1) it timed depths 5 and 6 alike (1.53 ms)
    and 3 to 4 at +0.40 ms against a mean step of 0.34, and a depth priced like the one below
    it was drafted whenever that one was (depth 6 in 339 of 593 steps). On the line each
    depth is priced from all of them, and the depths the planner visits, refreshed online,
    carry the rest."""
    ms, counts = table.read_many(depths, context_len)  # [K] each
    if len(depths) < 2:
        return ms
    d = [float(x) for x in depths]
    mean_d, mean_ms, slope = weighted_line(d, ms, [float(max(c, 1)) for c in counts])
    slope = max(0.0, slope)
    return [max(mean_ms + slope * (x - mean_d), 0.0) for x in d]


def _host_ms(table: CostTable, num_requests: int) -> float:
    """A host table's ms for N requests, flat past the largest N measured. A device forward
    over more rows than any measured costs proportionally more (CostTable.estimate), but a
    step's host work is mostly per step: scaled up from the first small batches of a run
    (one cell at N=12, read at N=64), the floor was priced at 20 ms of host time."""
    return table.estimate(min(num_requests, table.rows[-1]))


def draft_forwards(spec: PlannerSpec, *, num_requests: int, verify_rows: int, depth: int,
                    with_stage: bool) -> list[tuple[str, int, int]]:
    """The draft run as table cells: [(table, key, forwards)], table "draft" or "depth".
    At depth 0 (the floor) the drafter runs no forward: nothing (its cache writes are priced
    inside the verify)."""
    if depth == 0:
        return []
    if with_stage:
        return [("draft", verify_rows, 1), ("depth", depth, 1)]
    if spec.drafter_kind is DrafterKind.PARALLEL:
        return [("draft", verify_rows, 1), ("draft", num_requests * spec.block_rows(depth), 1)]
    return [("draft", verify_rows, 1)] + ([("draft", num_requests, depth - 1)]
                                          if depth > 1 else [])


def split_measured_ms(spec: PlannerSpec, tables: dict[str, CostTable], *, measured_ms: float,
                      parts: list[tuple[str, int, int]], context_len: float | None,
                      max_scale: float | None = None) -> list[tuple[str, int, float]]:
    """Attribute one measured time to table cells in proportion to their current estimates.

    parts: [(table name, key, forwards)]; returns [(table name, key, ms of one forward)].
    A run timed as a whole (one event pair around several forwards) says nothing about how its
    time divides, so the split keeps the tables' current ratios and moves their scale to the
    measurement. If every table involved is empty the time is split evenly over the forwards.
    max_scale: the split moves the estimates by at most this factor either way (None: any).
    """
    if any(tables[name].is_empty for name, _, _ in parts):
        forwards = sum(n for _, _, n in parts)
        return [(name, key, measured_ms / forwards) for name, key, _ in parts]
    guesses = [tables[name].estimate(key, context_len) for name, key, _ in parts]
    total = sum(g * n for g, (_, _, n) in zip(guesses, parts))
    scale = measured_ms / total
    if max_scale is not None:
        scale = min(max(scale, 1.0 / max_scale), max_scale)
    return [(name, key, g * scale) for g, (name, key, _) in zip(guesses, parts)]


def split_draft_ms(spec: PlannerSpec, draft: CostTable, *, measured_ms: float,
                   num_requests: int, verify_rows: int, depth: int,
                   context_len: float | None) -> list[tuple[int, float]]:
    """Attribute a measured draft run to draft-table cells: [(rows, ms of one forward), ...].

    The engine times the draft run as a whole (one event pair around all depths), so the
    measurement is split in proportion to the table's current estimates of its forwards. An
    empty table splits it evenly over the forwards.
    """
    parts = draft_forwards(spec, num_requests=num_requests, verify_rows=verify_rows,
                            depth=depth, with_stage=False)
    return [(key, ms) for _, key, ms in split_measured_ms(
        spec, {"draft": draft}, measured_ms=measured_ms, parts=parts, context_len=context_len)]
