"""Decision reuse: a fresh decision of the dynamic planner (lightspec.py) serves the next few
plan() calls of nearly the same shape.

Deciding is most of plan()'s host time, so a decision may serve the next few steps of nearly
the same shape (`replan_every`, grown at the floor up to `replan_limit`; the engine's
SERVING_REUSE) - but only while the host's time counts: an overlapped loop that hides the
step's host work under its device work with room to spare (`hidden_host_share`) decides
every step, from the latest statistics.

A mixin of LightSpecPlanner: it reads the planner's options, statistics, step count, stage 2
grid (`_stage2`, `_pick`) and the next proposal's room (`_next`).
"""

from __future__ import annotations

import math

import numpy as np

from .objective import StepCosts


class DecisionReuse:
    """Keeps the last fresh decision and hands it to the steps that may reuse it."""

    def _init_reuse(self, replan_every: int) -> None:
        # (shape key, plan() call, (fill, step ms, tokens, depth)) of the last decision
        self._decided: tuple | None = None
        self._horizon = replan_every  # plan() calls one decision may serve
        self._decided_depth: int | None = None  # the depth the last fresh decision chose

    def _decide(self, n: int, d_prev: int, depth: int, now: tuple[int, float, float],
                costs: StepCosts) -> None:
        """Keeps a fresh decision for _reuse. The steps that reuse it verify proposals of the
        chosen depth, so what they verify is stage 2's answer for that depth (`now`, this
        step's, when the depth stays): keyed by the verified depth, a decision that changed
        the depth was never reused by the step after it, and at c = 1, where the depth
        changes often, over half the steps decided afresh. A decision whose host time the
        loop hides (_host_hidden) is not kept."""
        answer = now
        g = self._stage2
        if depth != d_prev and g is not None:
            row = int(np.flatnonzero(g.depths == depth)[0])
            answer = self._pick(g, row, n, g.full[row])
        self._grow_horizon(depth)
        hidden = self._host_hidden(costs, depth, answer[1])
        self._decided = None if hidden else (
            (n, depth, self.stats.batch_version, self._ends_in_reach()), self.steps,
            (*answer, depth))

    def _host_hidden(self, costs: StepCosts, depth: int, step_ms: float) -> bool:
        """Whether a step of `depth` priced at `step_ms` keeps its host time hidden under the
        device with room to spare: the loop overlaps them, the host's part is at most
        hidden_host_share of the step, and what of it the loop exposes (HostOverlap, learned
        from periods that carry the timing noise) adds at most 5% to the step. Deciding
        afresh then costs the step next to nothing."""
        share = self.options.hidden_host_share
        if not (self.overlap and share > 0.0 and math.isfinite(step_ms)):
            return False
        host = float(costs.host(depth > 0))
        return host <= share * step_ms and costs.exposed * host <= 0.05 * step_ms

    def _grow_horizon(self, depth: int) -> None:
        """A fresh decision of `depth`: the floor chosen again doubles how long a decision
        is reused (up to replan_limit); anything else sets it back to replan_every."""
        base = self.options.replan_every
        limit = self.options.replan_limit or base
        again = depth == 0 and self._decided_depth == 0
        self._horizon = min(2 * self._horizon, limit) if again else base
        self._decided_depth = depth

    def _reuse(self, n: int, d_prev: int, available: int) -> tuple | None:
        """The last decision (fill, step ms, tokens, depth), carried to this step if it is
        younger than the reuse horizon (replan_every, grown up to replan_limit while fresh
        decisions repeat the floor) and was made for nearly this batch: the same depth
        verified and class mix, N within 1/32 of the decision's (exactly N below 32), as many
        requests with their end within reach (_ends_in_reach) to within N/4, and the
        same verify bucket when its fill is kept - at least N rows, at most those available.
        Without the count of ends, at c = 1 the floor chosen for a request's last tokens was
        kept for the first steps of the next one (math, Eagle3: 48 of 676 steps drafted
        nothing with the whole allowance ahead).
        A serving batch gains and loses a few requests at most steps (c = 256, math: N
        moved in 85% of steps, by 1-9 in 80%), and deciding afresh at each of them was most
        of plan()'s host time; the depth and bucket a decision chose stay right for a batch a
        few requests larger or smaller. The tokens it expects are rescaled to this batch: its
        target rows, and its accepted drafts in proportion to the draft rows left."""
        if self._decided is None:
            return None
        (n0, d0, version, reach0), at, (fill0, step_ms, tokens0, depth) = self._decided
        if (d_prev != d0 or version != self.stats.batch_version
                or self.steps - at >= self._horizon or abs(n - n0) > n0 // 32
                or abs(self._ends_in_reach() - reach0) > n0 // 4):
            return None
        fill = min(max(fill0, n), available)
        if fill != fill0 and self.spec.bucket_for(fill) != self.spec.bucket_for(fill0):
            return None
        drafts0 = fill0 - n0
        accepted = 0.0 if drafts0 <= 0 else (tokens0 - n0) * (fill - n) / drafts0
        return fill, step_ms, n + accepted, depth

    def _ends_in_reach(self) -> int:
        """Requests whose next proposal cannot use the deepest draft: their end is within
        reach, so their room, not the statistics, bounds what a depth is worth."""
        return self._next()[1]
