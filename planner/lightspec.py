"""LightSpec: choose the verify budget and the next draft depth from costs and statistics.

J(N, u, d) = [T_target(B) + T_draft(N, B, d)] / clamp(u * p(N, u, d), N, N(d+1)), in ms per
committed token (lightspec-algorithm.md §5-6; ModelTC/LightLLM `mtp_speculative/planner`):

* stage 1 (budget): u minimising J(N, u, d_prev) over the candidates for the proposal that
  exists, so the draft is priced at d_prev; ties go to the smaller u;
* stage 2 (next depth): d minimising min_u' J(N, u', d) over all allowed d with u' up to the
  full width N(d+1). It does not depend on stage 1, so a shallow proposal cannot trap the
  planner at low depth; ties go to the smaller d; beside the floor (ours), u' must reach
  level d - more rows than a full depth d - 1 proposal - or d verifies what d - 1 would;
* cold start: full width and the deepest depth until costs and a progress sample exist
  (a moderate depth, at most 3, while there are no costs at all).

Additions for serving (ours): a step is priced at its wall time - device time and the host
time the loop does not hide (objective.StepCosts) - so a host-bound regime makes rows and
depth free; a request's remaining allowance caps what the fill may verify and the next depth
may propose (`remaining`), and censored requests stay out of the survival; the floor, depth 0,
is a choice when the engine offers it (PlannerSpec.floor), taken only when it beats the best
speculative depth by `floor_margin`, since it forfeits the next step's proposal; statistics
are kept per sampling class and follow the batch's acceptance level (stats.py, survival.py,
level.py); host time is priced apart for drafting steps; and both stages choose at calibrated
prices: the model's step ms times what the loop's measured periods say that (bucket, depth)
cell and its regime really cost (calibration.py), with an occasional visit to a close,
unmeasured rival depth so that the calibration can compare it (explore.py). Stage 2 also
scales each depth's predicted drafts by what verified proposals of that depth accepted against their
prediction (calibration.TokenCalibration: the winner's curse of choosing deep on high
estimates), an autoregressive drafter's stage is priced on its line in depth rather than by
noisy single cells (objective._depth_line), the survival learns from trimmed steps at the
depths every request verified, from a weak prior (stats.py, survival.py), and a fill of more
rows is never expected to commit fewer tokens than a smaller one (`_grid`).

Deciding is most of plan()'s host time, so a decision may serve the next few steps of nearly
the same shape (reuse.py). Probes and visits to rival depths keep the deep statistics and
the calibration of close rivals current (explore.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .base import BasePlanner, Sample, full_rows
from .calibration import TokenCalibration
from .costs import CostTable
from .explore import Exploration
from .objective import StepCosts, first_best
from .options import LightSpecOptions
from .reuse import DecisionReuse
from .stats import AcceptanceStats
from .survival import non_decreasing
from .types import PlannerSpec, StepObservation, StepPlan


@dataclass(frozen=True, kw_only=True, eq=False)
class _Grid:
    """Candidates priced at several depths (LightSpecPlanner._grid): [D] rows, [C] columns."""

    depths: np.ndarray  # [D]
    full: np.ndarray  # [D] rows of each depth's full width (its last candidate's cap)
    u: np.ndarray  # [D, C] useful rows
    valid: np.ndarray  # [D, C] bool: the column's bucket is a candidate at that depth
    progress: np.ndarray  # [D, C] committed tokens per row
    step_ms: np.ndarray  # [D, C] the model's wall ms
    scales: np.ndarray  # [D, C] calibration factors on step_ms
    buckets: np.ndarray  # [C]


class LightSpecPlanner(Exploration, DecisionReuse, BasePlanner):
    """Dynamic verify budget and draft depth (training-free)."""

    name = "dynamic"

    def __init__(self, spec: PlannerSpec, *, target_costs: CostTable | None = None,
                 draft_costs: CostTable | None = None, depth_costs: CostTable | None = None,
                 host_costs: CostTable | None = None, overlap: bool = True,
                 options: LightSpecOptions | None = None) -> None:
        self.options = options or LightSpecOptions()
        super().__init__(spec, target_costs=target_costs, draft_costs=draft_costs,
                         depth_costs=depth_costs, host_costs=host_costs, overlap=overlap,
                         refresh_costs=self.options.refresh_costs,
                         refresh_cells=self.options.refresh_cells,
                         reprice_every=self.options.reprice_every)
        self.stats = AcceptanceStats(max_depth=spec.max_depth,
                                     progress_decay=self.options.progress_decay,
                                     survival_decay=self.options.survival_decay,
                                     estimator=self.options.estimator,
                                     half_life=self.options.stat_half_life,
                                     sample_floor=self.options.sample_floor,
                                     full_width_from_survival=(
                                         self.options.full_width_from_survival),
                                     level_rho=self.options.level_rho,
                                     level_variance=self.options.level_variance,
                                     survival_from_trimmed=self.options.survival_from_trimmed,
                                     prior_weight=self.options.survival_prior_weight,
                                     prior_accept=self.options.survival_prior_accept)
        self.linear_depth = self.options.linear_depth
        self.tokens = TokenCalibration()  # predicted vs accepted drafts by depth
        self._init_explore()
        self._init_reuse(self.options.replan_every)
        self._scale_cache: tuple | None = None  # (key, [D, C] calibration factors)
        self._stage2: _Grid | None = None  # stage 2's grid, within one plan() call
        self._buckets = np.asarray(spec.verify_buckets)
        self._choices = np.asarray(spec.choices)
        self._next_of: tuple | None = None  # (the self._room it was for, _next())
        # [D] the index of each choice's max(d - 1, 0) among the choices (None if one is not
        # a choice): stage 2 reads a full proposal one shallower from the full widths it has
        choices = self._choices.tolist()
        shallower = [max(d - 1, 0) for d in choices]
        self._one_less = (np.array([choices.index(d) for d in shallower])
                          if set(shallower) <= set(choices) else None)

    # ---- planning --------------------------------------------------------------------------

    def _plan(self, *, n: int, m: int, d_prev: int, available: int,
              confidences: np.ndarray | None) -> StepPlan:
        self.stats.set_batch(self._classes)
        if m < n:
            self.stats.admit(n - m, n)
        if not (self.has_costs and self.stats.has_progress):
            return self._make(n=n, m=m, d_prev=d_prev, fill=available,
                              depth=self._cold_depth(), reason="cold")
        if self._floor_visit > 0 and d_prev == 0:
            return self._visit_floor(n, m, available)
        self._floor_visit = 0
        # A probe is verified by the first step that holds its proposal, new requests in the
        # batch or not (they verify their target row alone; the sample is the others). One
        # the engine drafted shallower is dropped rather than drafted again: waiting for a
        # batch without new requests kept one pending for up to 130 steps at c = 256 with
        # requests ending every step (ShareGPT), each step drafting the probe's depth and
        # deciding afresh. (With no proposal at all - a lone request ended - it waits.)
        probing = self._probe_depth > 0 and d_prev >= self._probe_depth
        if self._probe_depth > 0 and not probing and m > 0:
            self._end_probe()
        reused = None if probing or self._probe_depth else self._reuse(n, d_prev, available)
        if reused is not None:
            fill, step_ms, tokens, depth = reused
            self._spend(step_ms)
            return self._make(n=n, m=m, d_prev=d_prev, fill=fill, depth=depth, reason="plan",
                              predicted_ms=step_ms, predicted_tokens=tokens)
        costs = self._costs(n)
        depth, best_j = self._next_depth(costs, n)  # first: stage 1 may read its grid
        fill, step_ms, tokens = self._evaluate(costs, n, available, d_prev, full=probing)
        reason = "probe" if probing else "plan"
        if probing:
            self._end_probe()
        if self._probe_depth == 0:
            self._probe_depth = self._maybe_probe(costs, n, depth, best_j)
        rival = None
        if self._probe_depth > 0:
            depth = self._probe_depth
        else:
            rival = self._rival(depth, best_j)
            depth = depth if rival is None else rival
            if rival == 0:  # this step drafts nothing; the visit's floor steps follow
                self._floor_visit = self.options.floor_visit - 1
        if not probing:
            self._spend(step_ms)
        # A probe or a rival's visit is one step's decision, never reused.
        self._decided = None
        if not (probing or self._probe_depth or rival is not None):
            self._decide(n, d_prev, depth, (fill, step_ms, tokens), costs)
        self._stage2 = None  # priced for this call only
        return self._make(n=n, m=m, d_prev=d_prev, fill=fill, depth=depth, reason=reason,
                          predicted_ms=step_ms, predicted_tokens=tokens)

    def _visit_floor(self, n: int, m: int, available: int) -> StepPlan:
        """A step of a visit to the floor (Exploration._rival): it verifies the target rows
        and drafts nothing again, priced as a fresh floor decision would be, so that its
        period is a sample of the floor's calibration cell."""
        self._floor_visit -= 1
        fill, step_ms, tokens = self._evaluate(self._costs(n), n, available, 0)
        self._spend(step_ms)
        return self._make(n=n, m=m, d_prev=0, fill=fill, depth=0, reason="visit",
                          predicted_ms=step_ms, predicted_tokens=tokens)

    def _cold_depth(self) -> int:
        """Depth before the first statistics. With costs (the engine's sweep or its cached
        tables) that is one step: draft the deepest depth and verify it at full width, which
        measures the survival of every depth at once. Without costs the planner cannot price
        anything and may stay cold for long, so it drafts a moderate depth (at most 3, the
        usual good static K) rather than the deepest."""
        if self.has_costs:
            return self.spec.draft_depths[-1]
        moderate = [d for d in self.spec.draft_depths if d <= 3]
        return moderate[-1] if moderate else self.spec.draft_depths[0]

    def ms_per_token(self, *, num_requests: int, fill_rows: int, depth: int,
                     context_len: float | None = None) -> float:
        """J(N, u, d): estimated wall ms per committed token of verifying `fill_rows` rows of a
        depth-`depth` proposal for N requests (its bucket's cost), its drafts scaled by the
        token calibration as stage 2 prices the next depth (stage 1, the fill of a proposal
        already drafted, does without it). For diagnostics and tests; plan() evaluates the
        same quantity, at calibrated step prices."""
        if not self.has_costs:
            raise ValueError("no cost estimates yet: give target_costs and draft_costs")
        context = self._context if context_len is None else context_len
        costs = StepCosts.price(self.spec, self.target_costs, self.draft_costs,
                                num_requests=num_requests, context_len=context,
                                depth_costs=self.depth_costs, host_costs=self.host_costs,
                                host_draft_costs=self.host_draft_costs,
                                exposed=self.host_overlap.exposed(num_requests),
                                linear_depth=self.linear_depth)
        if fill_rows < num_requests:
            raise ValueError(f"fill_rows ({fill_rows}) must be >= num_requests "
                             f"({num_requests})")
        self.spec.bucket_for(fill_rows)  # raises past the largest bucket
        # fill_rows is the last candidate of its own grid row: priced as plan() prices it
        g = self._grid(costs, num_requests, np.array([depth]), np.array([fill_rows]), None)
        last = int(np.count_nonzero(g.valid[0])) - 1
        tokens = min(max(float(g.u[0, last] * g.progress[0, last]), num_requests),
                     num_requests * (depth + 1))
        if self.options.calibrate_tokens:  # as stage 2 prices a depth
            tokens = num_requests + float(self.tokens.factors([depth])[0]) * (
                tokens - num_requests)
        return float(g.step_ms[0, last]) / tokens

    def _grid(self, costs: StepCosts, n: int, depths: np.ndarray, full: np.ndarray,
              room: np.ndarray | None) -> _Grid:
        """Every candidate u at each depth d: the buckets from N's up to the one holding
        full[d] rows (the last cut to full[d], as candidate_rows gives them), their progress
        under `room`, model step ms and calibration, in one pass - plan() runs on the host
        every step, and its time is part of the step's."""
        buckets = self._buckets  # [all buckets]
        lo = int(np.searchsorted(buckets, n, side="left"))
        hi = np.minimum(np.searchsorted(buckets, full, side="left"), len(buckets) - 1)  # [D]
        cols = buckets[lo:int(hi.max()) + 1]  # [C]
        u = np.minimum(cols[None, :], full[:, None])  # [D, C]
        valid = np.arange(len(cols))[None, :] <= (hi - lo)[:, None]  # [D, C]
        progress = self.stats.progress_grid(n, u, depths, now=self.steps, room=room)
        # The estimates come from different sources (a trimmed key's EMA, the survival at
        # full width) that need not agree that more rows commit more tokens (n-gram,
        # ShareGPT, c = 1, depth 3: 3 rows priced at 1.90 tokens, 4 rows at 1.87): a row out
        # of order takes the least-squares non-decreasing fit, where a running maximum would
        # lift each candidate to the noisiest estimate before it.
        tokens = u * progress  # [D, C]; u ascends along C
        for i in np.flatnonzero((tokens[:, 1:] < tokens[:, :-1]).any(axis=1)).tolist():
            k = int(np.count_nonzero(valid[i]))  # valid columns: a prefix
            tokens[i, :k] = non_decreasing(tokens[i, :k].tolist())
            tokens[i, k:] = tokens[i, k - 1]
            progress[i] = tokens[i] / u[i]
        return _Grid(depths=depths, full=full, u=u, valid=valid, progress=progress,
                     step_ms=costs.step_ms_grid(cols, depths), scales=self._scales(cols, depths),
                     buckets=cols)

    def _evaluate(self, costs: StepCosts, n: int, available: int, depth: int,
                  full: bool = False) -> tuple[int, float, float]:
        """Stage 1: the u with the lowest ms per token (or the full width for a probe).

        Stage 2 (run first) has priced this depth's row already when no request's end is
        near: its room then fills every level as this step's does, and its width is this
        step's `available`."""
        g, row = self._stage2, None
        if g is not None and (self._room is None or self._room.min() > self.spec.max_depth):
            hit = np.flatnonzero(g.depths == depth)
            if hit.size and g.full[hit[0]] == available:
                row = int(hit[0])
        if row is None:
            g, row = self._grid(costs, n, np.array([depth]), np.array([available]),
                                self._room), 0
        return self._pick(g, row, n, full_rows(n, depth, self._room), full=full)

    @staticmethod
    def _pick(g: _Grid, row: int, n: int, cap, *, full: bool = False
              ) -> tuple[int, float, float]:
        """Stage 1's answer from one priced row of a grid: (u, model step ms, tokens) of the
        candidate with the lowest calibrated ms per token (the last, the full width, for a
        probe); cap: the most tokens the proposal can commit."""
        keep = g.valid[row]
        u, step_ms = g.u[row][keep], g.step_ms[row][keep]
        tokens = np.minimum(np.maximum(u * g.progress[row][keep], n), cap)  # np.clip, cheaper
        if full:
            i = len(u) - 1
        else:  # chosen at the calibrated price; predicted_ms stays the model's (calibration.py)
            i = first_best(step_ms * g.scales[row][keep] / tokens)
        return int(u[i]), float(step_ms[i]), float(tokens[i])

    def _next_room(self) -> np.ndarray | None:
        """[N] drafts each request can use in the next proposal: this step commits at least
        one of its remaining tokens, and the next one's bonus another."""
        return self._next()[0]

    def _next(self) -> tuple[np.ndarray | None, int]:
        """(_next_room(), _ends_in_reach()), worked out once per plan() call (each call sets
        a new self._room; stage 2 and the reuse key both read them)."""
        room = self._room
        if self._next_of is None or self._next_of[0] is not room:
            nxt = None if room is None else np.maximum(room - 1, 0)
            reach = 0 if nxt is None else int(np.count_nonzero(nxt < self.spec.max_depth))
            self._next_of = (room, (nxt, reach))
        return self._next_of[1]

    def _next_depth(self, costs: StepCosts, n: int) -> tuple[int, float]:
        """Stage 2: the depth whose best full-proposal configuration costs least per token.

        Every allowed depth d at once (0, the floor, when the engine offers it): a [D, C] grid
        of candidates u up to the full width of the next proposal (_grid)."""
        depths = self._choices  # [D]
        room = self._next_room()
        full = np.minimum(full_rows(n, depths, room), self.spec.max_requests)  # [D]
        g = self._stage2 = self._grid(costs, n, depths, full, room)
        tokens = np.minimum(np.maximum(g.u * g.progress, n), full[:, None])  # [D, C]
        if self.options.calibrate_tokens:  # the bonus tokens are certain; the drafts are not
            tokens = n + self.tokens.factors(depths)[:, None] * (tokens - n)
        useful = g.valid
        if depths[0] == 0:
            # Beside the floor, depth d is a choice only with a fill that reaches its level d:
            # more rows than a full proposal one shallower holds (N at d = 1). With fewer, the
            # fill verifies what depth d - 1 would and pays for deeper drafting - at d = 1 it
            # verifies no draft at all - yet the calibration's noise priced such cells within
            # the floor's 2% margin (math, n-gram, c = 16: the engine drafted depths 1-7 to
            # verify nothing on 4 steps in 10).
            one_less = self._one_less  # [D] where max(d - 1, 0) sits among the choices
            shallower = full[one_less] if one_less is not None else np.minimum(
                full_rows(n, np.maximum(depths - 1, 0), room), self.spec.max_requests)  # [D]
            useful = useful & ((depths == 0)[:, None] | (g.u > shallower[:, None]))
        j = np.where(useful, g.step_ms * g.scales / tokens, np.inf)
        best_by_depth = j.min(axis=1).tolist()  # [D]
        best_depth, best_j = int(depths[0]), math.inf
        for depth, value in zip(depths.tolist(), best_by_depth):
            if value < best_j * (1.0 - 1e-12):  # ties (to rounding) keep the smaller depth
                best_depth, best_j = depth, value
        # [D] each depth's best price and its bucket, for _rival and _best_drafting
        self._by_depth = (depths, g.buckets[np.argmin(j, axis=1)], best_by_depth)
        if best_depth == 0 and len(depths) > 1:
            # The floor also forfeits the next step's proposal (and what it would teach):
            # take it only when it is clearly cheaper than the best speculative choice.
            spec_depth, spec_j = self._best_drafting()
            if best_by_depth[0] >= (1.0 - self.options.floor_margin) * spec_j:
                best_depth, best_j = spec_depth, spec_j
        return best_depth, best_j

    def _scales(self, buckets: np.ndarray, depths: np.ndarray) -> np.ndarray:
        """[D, C] factors on the modelled wall ms of (depth, bucket) steps: what the loop's
        periods say those steps really cost (calibration.py); 1 with calibrate off."""
        if not self.options.calibrate:
            return np.ones((len(depths), len(buckets)))
        # Every (depth, bucket) cell at once, sliced for each caller: stage 1 and stage 2 ask
        # for different cells in the same plan() call, and the calibration moves every step.
        key = (self.calibration.version, self.steps // 64)
        if self._scale_cache is None or self._scale_cache[0] != key:
            every = self.spec.verify_buckets
            self._scale_cache = (key, self.calibration.grid(
                every, range(self.spec.max_depth + 1), self.steps), np.asarray(every))
        _, grid, every = self._scale_cache
        return grid[np.asarray(depths)[:, None], np.searchsorted(every, buckets)[None, :]]

    # ---- statistics ------------------------------------------------------------------------

    def observe(self, obs: StepObservation) -> None:
        super().observe(obs)
        plan = obs.plan
        if plan.num_requests and plan.verified_depth > 0 and math.isfinite(plan.predicted_tokens):
            n = plan.num_requests
            self.tokens.observe(depth=plan.verified_depth,
                                predicted_drafts=plan.predicted_tokens - n,
                                accepted_drafts=float(np.sum(obs.accept_lens)) - n)

    def _record(self, sample: Sample) -> None:
        self.stats.record(num_requests=sample.num_requests, fill_rows=sample.fill_rows,
                          depth=sample.depth, accept_lens=sample.accept_lens,
                          verify_lens=sample.verify_lens, uncensored=sample.uncensored,
                          step=self.steps,
                          full_width=sample.full_width, classes=sample.classes)
