"""What every planner shares: argument checks, the proposal depth, online cost refresh.

Call protocol (engine, host side, once per decode step):

    plan_i = planner.plan(num_requests=N, num_with_proposal=M, ...)
    ... launch step i; then, possibly after plan_{i+1}, ...
    planner.observe(StepObservation(plan=plan_i, accept_lens=..., target_ms=..., ...))

With overlapped scheduling plan(i+1) runs before observe(i): statistics arrive a step late, but
the depth of the proposal plan(i+1) verifies is the draft depth plan(i) chose, which the planner
remembers itself. Observations carry their own plan, so late or out-of-order observations
update the configuration that actually ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .calibration import HostOverlap, StepCalibration
from .costs import CostTable
from .objective import StepCosts, draft_forwards, split_measured_ms
from .types import PlannerSpec, StepObservation, StepPlan


class BasePlanner:
    """Shared state; subclasses implement _plan() and optionally _record()."""

    name = "base"

    def __init__(self, spec: PlannerSpec, *, target_costs: CostTable | None = None,
                 draft_costs: CostTable | None = None, depth_costs: CostTable | None = None,
                 host_costs: CostTable | None = None, overlap: bool = True,
                 refresh_costs: bool = True, refresh_cells: bool = False,
                 reprice_every: int = 8) -> None:
        """target_costs: verify ms by rows B. draft_costs: ms of the drafter's first forward by
        rows (over the B verified rows; also each further depth over N rows unless depth_costs
        is given). depth_costs (optional): ms of the whole drafting stage after that first
        forward, keyed by depth d, for engines that time it per depth (objective.draft_cost_ms).
        host_costs (optional): the serving loop's host ms per step by requests N, refreshed by
        observe_host(); `overlap`: the prior for how the loop hides host time (a step costs
        max(device, host) with it, their sum without; learned from the loop's periods: see
        calibration.HostOverlap). Steps
        that draft are timed apart (host_draft_costs, learned online only): they dispatch a
        second executable and do more bookkeeping, and one table for both would price
        drafting at whichever regime the planner sat in.
        refresh_costs: fold measured step times into the device tables, as a change of level
        of each context column (CostTable.update_level), or cell by cell (`refresh_cells`).
        reprice_every: plan() prices every bucket once and reuses the prices for up to this
        many calls while N and the context stay put (within 2%), even if the online refresh
        moved the tables meanwhile: pricing is most of plan()'s time, and one refreshed
        sample moves a cell by a tenth at most.
        """
        if not isinstance(spec, PlannerSpec):
            raise TypeError(f"spec must be a PlannerSpec, got {type(spec).__name__}")
        self.spec = spec
        self.target_costs = target_costs if target_costs is not None else CostTable()
        self.draft_costs = draft_costs if draft_costs is not None else CostTable()
        self.depth_costs = depth_costs if depth_costs is not None else CostTable()
        self.host_costs = host_costs if host_costs is not None else CostTable()
        self.host_draft_costs = CostTable()  # host ms of steps that draft, by N
        self.calibration = StepCalibration()  # the loop's measured step times vs predicted
        self.overlap = bool(overlap)
        self.host_overlap = HostOverlap(prior=0.0 if self.overlap else 1.0)
        self.refresh_costs = refresh_costs
        self.refresh_cells = refresh_cells
        if reprice_every < 1:
            raise ValueError(f"reprice_every must be >= 1, got {reprice_every}")
        self.reprice_every = int(reprice_every)
        self._priced: tuple | None = None  # (key, StepCosts, context, plan call) of the last
        self._room: np.ndarray | None = None  # [N] draft rows each request may still use
        self._classes: np.ndarray | None = None  # [N] sampling classes of the planned batch
        self.steps = 0  # plan() calls so far
        self._depth = 0  # depth of the proposal the next step verifies (0: none yet)
        self._context: float | None = None  # last batch context seen
        self._full_rows = 0  # this step's rows at full width (StepPlan.full_rows)
        self.linear_depth = False  # price the draft stage on a line in depth (StepCosts.price)

    @property
    def has_costs(self) -> bool:
        return not (self.target_costs.is_empty or self.draft_costs.is_empty)

    def plan(self, *, num_requests: int, num_with_proposal: int | None = None,
             confidences: np.ndarray | None = None, context_len: float | None = None,
             proposal_depth: int | None = None, remaining: np.ndarray | None = None,
             sampling_classes: np.ndarray | None = None) -> StepPlan:
        """Choose this step's verify bucket and the next draft depth.

        num_requests: N, requests in the step (0 <= N <= largest verify bucket).
        num_with_proposal: M, requests that hold a proposal (new requests may not); default N.
        confidences: [N, >= d_prev] drafter confidences of the current proposal (only the
          DSpark-style planner reads them); NaN or <= 0 marks "no draft token here".
        context_len: KV tokens the step attends, summed over requests; default the last
          observed one.
        proposal_depth: depth of the proposal this step verifies, if the engine drafted
          something other than the previous plan's draft_depth (e.g. capped near max length).
        remaining: [N] tokens each request may still emit this step onward (>= 1), if known.
          A request commits at most that many, so the fill has no use for its drafts beyond
          remaining - 1, and the next proposal none beyond remaining - 2.
        sampling_classes: [N] small ints, requests that sample alike (greedy, a temperature
          band) share a class; statistics are kept per class (stats.AcceptanceStats).
        """
        n = _as_count("num_requests", num_requests)
        m = n if num_with_proposal is None else _as_count("num_with_proposal", num_with_proposal)
        if m > n:
            raise ValueError(f"num_with_proposal ({m}) cannot exceed num_requests ({n})")
        if n > self.spec.max_requests:
            raise ValueError(
                f"{n} requests exceed the largest verify bucket {self.spec.max_requests}: every "
                f"request needs a target row; compile a bucket >= {n} or cap the batch size")
        if proposal_depth is not None:
            self._depth = _as_count("proposal_depth", proposal_depth)
            if self._depth > self.spec.max_depth:
                raise ValueError(f"proposal_depth {self._depth} exceeds max_depth "
                                 f"{self.spec.max_depth}")
        if context_len is not None:
            if not math.isfinite(context_len) or context_len < 0:
                raise ValueError(f"context_len must be finite and >= 0, got {context_len}")
            self._context = float(context_len)
        if sampling_classes is not None and np.shape(sampling_classes) != (n,):
            raise ValueError(f"sampling_classes must be [N] = ({n},), got shape "
                             f"{np.shape(sampling_classes)}")
        self._classes = sampling_classes
        self._room = None
        if remaining is not None:
            rem = np.asarray(remaining)
            if rem.shape != (n,) or not np.issubdtype(rem.dtype, np.integer) or (
                    n and rem.min() < 1):
                raise ValueError(f"remaining must be [N] = ({n},) ints >= 1, got shape "
                                 f"{rem.shape} dtype {rem.dtype}")
            self._room = rem.astype(np.int64) - 1
        self.steps += 1
        d_prev = self._depth if m > 0 else 0
        if n == 0:
            plan = StepPlan(num_requests=0, num_with_proposal=0, verified_depth=0, fill_rows=0,
                            verify_rows=0, draft_depth=self.spec.draft_depths[0],
                            update_stats=False, reason="empty")
        else:
            self._full_rows = min(n + m * d_prev, full_rows(n, d_prev, self._room))
            available = min(self._full_rows, self.spec.max_requests)
            plan = self._plan(n=n, m=m, d_prev=d_prev, available=available,
                              confidences=confidences)
        self._depth = plan.draft_depth
        return plan

    def observe(self, obs: StepObservation) -> None:
        """Fold a finished step's measurements in (any time after its plan)."""
        plan = obs.plan
        if plan.num_requests == 0:
            return
        accept = np.asarray(obs.accept_lens)
        _check_observation(plan, accept, obs.verify_lens)
        context = obs.context_len
        if context is not None:
            self._context = float(context)
        if self.refresh_costs:
            self._refresh(obs, context)
        if plan.update_stats:
            sample = _learnable(obs, accept)
            if sample is not None:
                self._record(sample)

    def observe_host(self, *, num_requests: int, host_ms: float, drafted: bool = False) -> None:
        """Fold the loop's measured host ms of a decode step with N requests (EMA by N), into
        the drafting steps' table when the step `drafted` (dispatched a draft run)."""
        if self.refresh_costs and num_requests > 0 and math.isfinite(host_ms) and host_ms > 0:
            table = self.host_draft_costs if drafted else self.host_costs
            n, ms = int(num_requests), float(host_ms)
            if table.count(n):
                # As for the device tables (_refresh): one sample moves its cell at most 2x
                # toward itself. A host stall (a preemption, a collection, a lazy first run)
                # would otherwise price a regime far off, and a regime priced far off is never
                # visited again to be corrected.
                old = table.estimate(n)
                ms = min(max(ms, 0.5 * old), 2.0 * old)
            table.update(n, ms)

    def observe_period(self, *, plan: StepPlan, period_ms: float) -> None:
        """The loop's measured wall ms of a decode step (between its read-back and the one
        before, both decode steps: the drafting of the proposal it verified, then its verify)
        against the plan's prediction, which prices the same (calibration.py)."""
        if not (self.refresh_costs and plan.num_requests > 0):
            return
        self.calibration.observe(bucket=plan.verify_rows, depth=plan.verified_depth,
                                 predicted_ms=plan.predicted_ms, measured_ms=period_ms,
                                 step=self.steps)
        if self._priced is not None and self._priced[0][0] == plan.num_requests:
            # The same step's device and host parts at the prices plan() last used for this
            # N (pricing another N here would evict plan()'s reused prices).
            costs = self._priced[1]
            device = costs.device_ms(plan.verify_rows, plan.verified_depth)
            host = float(costs.host(plan.verified_depth > 0))
            self.host_overlap.observe(num_requests=plan.num_requests, device_ms=device,
                                      host_ms=host, period_ms=period_ms)

    def _costs(self, n: int) -> StepCosts:
        """Every bucket priced for N requests at the current context (see reprice_every)."""
        tables = (self.target_costs, self.draft_costs, self.depth_costs, self.host_costs,
                  self.host_draft_costs)
        exposed = self.host_overlap.exposed(n)
        key = (n, tuple(t.version for t in tables), round(exposed, 2))
        context = self._context
        if self._priced is not None:
            old_key, costs, old_context, at = self._priced
            near = (context == old_context or (
                context is not None and old_context is not None
                and abs(context - old_context) <= 0.02 * max(old_context, 1.0)))
            if near and old_key[0] == n and (old_key == key
                                             or self.steps - at < self.reprice_every):
                return costs
        costs = StepCosts.price(self.spec, self.target_costs, self.draft_costs,
                                num_requests=n, context_len=context,
                                depth_costs=self.depth_costs, host_costs=self.host_costs,
                                host_draft_costs=self.host_draft_costs, exposed=exposed,
                                linear_depth=self.linear_depth)
        self._priced = (key, costs, context, self.steps)
        return costs

    def _refresh(self, obs: StepObservation, context: float | None) -> None:
        """Fold measured times into the cost tables: an EMA of each context column's level
        (CostTable.update_level), or of each cell (`refresh_cells`)."""
        plan = obs.plan
        drafted = plan
        if obs.step_ms is not None and obs.draft_plan is not None:
            drafted = obs.draft_plan
            if drafted.num_requests == 0:  # nothing was drafted: the interval is the verify's
                drafted = None
        tables = {"target": self.target_costs, "draft": self.draft_costs,
                  "depth": self.depth_costs}
        draft_parts = [] if drafted is None else draft_forwards(
            self.spec, num_requests=drafted.num_requests, verify_rows=drafted.verify_rows,
            depth=drafted.draft_depth, with_stage=not self.depth_costs.is_empty)
        measured = []  # (parts, ms) pairs, each a run timed as a whole
        if obs.step_ms is not None:
            measured.append(([("target", plan.verify_rows, 1)] + draft_parts, obs.step_ms))
        else:
            if obs.target_ms is not None:
                measured.append(([("target", plan.verify_rows, 1)], obs.target_ms))
            if obs.draft_ms is not None and draft_parts:
                measured.append((draft_parts, obs.draft_ms))
        for parts, ms in measured:
            # One sample moves its cells at most 2x toward itself: a step timed through a
            # preemption on a shared machine would otherwise set a cell several-fold off, and
            # the imputed cells around it with it. A real change still gets there, a factor 2
            # per sample, at the EMA's pace.
            moved = set()  # tables whose level this sample moved (every part, one factor)
            for name, key, per_forward in split_measured_ms(
                    self.spec, tables, measured_ms=ms, parts=parts, context_len=context,
                    max_scale=2.0):
                if self.refresh_cells:
                    tables[name].update(key, per_forward, context)
                elif name not in moved:
                    moved.add(name)
                    tables[name].update_level(key, per_forward, context)

    # ---- subclass hooks --------------------------------------------------------------------

    def _plan(self, *, n: int, m: int, d_prev: int, available: int,
              confidences: np.ndarray | None) -> StepPlan:
        raise NotImplementedError

    def _record(self, sample: Sample) -> None:
        """Statistics update for an eligible step; planners without statistics ignore it."""

    # ---- helpers ---------------------------------------------------------------------------

    def _make(self, *, n: int, m: int, d_prev: int, fill: int, depth: int, reason: str,
              predicted_ms: float = math.nan, predicted_tokens: float = math.nan) -> StepPlan:
        # A step teaches something only if some request had a proposal to verify; the sample
        # is those requests alone (_learnable).
        return StepPlan(num_requests=n, num_with_proposal=m, verified_depth=d_prev,
                        fill_rows=int(fill), verify_rows=self.spec.bucket_for(int(fill)),
                        draft_depth=int(depth), update_stats=(m > 0 and d_prev > 0),
                        reason=reason, full_rows=self._full_rows,
                        predicted_ms=float(predicted_ms),
                        predicted_tokens=float(predicted_tokens))


@dataclass(frozen=True, kw_only=True, eq=False)
class Sample:
    """What the statistics learn from one step: the requests that held a proposal.

    A request admitted since the last step verifies only its target row (the skip rule of
    LightLLM's planner drops the whole step for it). The device's fill gives such a request
    exactly that one row and spreads the rest over the others by survival, as it would for
    them alone, so those others are an exact (N', u', d) step: N' of them over u' = u - (N - N')
    rows.
    """

    num_requests: int  # N'
    fill_rows: int  # u'
    depth: int  # d_prev, the depth of the proposal verified
    accept_lens: np.ndarray  # [N'] bonus included
    verify_lens: np.ndarray | None  # [N'] rows verified per request, its target row included
    uncensored: np.ndarray | None  # [N'] bool: counted in the survival (None: by verify_lens)
    classes: np.ndarray | None  # [N'] sampling classes
    full_width: bool | None  # every usable draft verified (None: judge by N'(d + 1))


def _learnable(obs: StepObservation, accept: np.ndarray) -> Sample | None:
    """The proposal holders of an observed step (obs.had_proposal), or None if there are none
    or a mixed step does not say which requests they were."""
    plan = obs.plan
    n = plan.num_requests
    held = obs.had_proposal
    if held is None:
        if plan.num_with_proposal < n:
            return None
        held = np.ones(n, bool)
    held = np.asarray(held, dtype=bool)
    if held.shape != (n,):
        raise ValueError(f"had_proposal must be [N] = ({n},) bools, got shape {held.shape}")
    k = int(held.sum())
    if k == 0:
        return None

    def pick(x):
        return None if x is None else np.asarray(x)[held]

    # A request that ended on the device before the step (the engine then reports fewer than
    # the plan's) took no row either, but the others cannot use more than a full width.
    fill = min(plan.fill_rows - (n - k), k * (plan.verified_depth + 1))
    return Sample(num_requests=k, fill_rows=fill, depth=plan.verified_depth,
                  accept_lens=accept[held], verify_lens=pick(obs.verify_lens),
                  uncensored=pick(obs.uncensored),
                  classes=pick(obs.sampling_classes),
                  full_width=None if plan.full_rows == 0 else plan.fill_rows >= plan.full_rows)


def full_rows(n: int, depth, room: np.ndarray | None):
    """Rows of a full-width verify of a depth-`depth` proposal: N target rows and each
    request's drafts up to its room ([N] drafts it can still use; None: no end in sight).
    `depth` an int -> an int; [D] depths -> [D] rows (stage 2 asks for every depth at once)."""
    if np.ndim(depth) == 0:
        if room is None:
            return n * (depth + 1)
        return n + int(np.minimum(room, depth).sum())
    depths = np.asarray(depth)  # [D]
    if room is None:
        return n * (depths + 1)
    return n + np.minimum(room[None, :], depths[:, None]).sum(axis=1)


def _as_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def _check_observation(plan: StepPlan, accept: np.ndarray, verify_lens) -> None:
    n = plan.num_requests
    if accept.shape != (n,):
        raise ValueError(f"accept_lens must have shape ({n},) for a plan with {n} requests, "
                         f"got {accept.shape}")
    if not np.issubdtype(accept.dtype, np.number):
        raise ValueError("accept_lens must be finite numbers")
    lo, hi = accept.min(), accept.max()  # a NaN anywhere is the min's and the max's
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError("accept_lens must be finite numbers")
    if lo < 1 or hi > plan.verified_depth + 1:
        raise ValueError(
            f"accept_lens must lie in [1, {plan.verified_depth + 1}] (bonus included, proposal "
            f"depth {plan.verified_depth}), got min {lo} max {hi}")
    if verify_lens is not None:
        rows = np.asarray(verify_lens)
        if rows.shape != (n,) or rows.min() < 1 or (accept > rows).any():
            raise ValueError("verify_lens must be [N] ints >= 1 with accept_lens <= verify_lens")
        if rows.sum() > plan.verify_rows:
            raise ValueError(f"verify_lens sum to {rows.sum()} rows, more than the "
                             f"{plan.verify_rows}-row bucket that ran")
