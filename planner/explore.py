"""Exploration of the dynamic planner (lightspec.py): probes and visits to rival depths.

Exploration (ours; LightLLM's first commit had periodic full-verify probes, §10): once the
planner trims or drafts shallow, deeper positions are verified only for confident requests or
not at all, and their full-width survival stops being refreshed; if acceptance then rises, the
stale estimates keep the planner shallow. A probe drafts depth d + 2 (d the current best depth,
capped at the deepest allowed) and verifies it at full width on the next step: the two
positions past the best are the ones stage 2 weighs next, and a planner whose best depth grows
climbs there a depth or two per probe. From the floor (d = 0) a probe asks whether drafting
pays again, so d is the best depth >= 1 by stage 2's prices: two past the floor, a depth-2
probe could not see the long runs an n-gram lookup copies, and a lone request (math,
c = 1) sat at the floor for 419 of 636 steps while static K = 5 drafted on every one. The
first rule, 2d + 1, measured further out at a cost growing with d: in the simulator (H200 /
Qwen3-14B, code, c = 16) probes to depth 9 or 11 every 16 steps left the planner 2.2% behind
static K = 4 (0.7% with exploration off); over the simulator's 15 cells and three seeds d + 2
did at least as well in 14 (BENCHMARKS.md, "Fortieth session: probes two depths past the
best"). Probes are budgeted: one runs when its estimated extra cost (its ms minus its tokens
priced at the current best ms/token) is at most `explore_fraction` of the step time spent
since the last probe, and at least `min_probe_interval` steps apart.

A rival visit serves the whole-step calibration the same way (`_rival`); one to the floor
is a short run of floor steps.

A mixin of LightSpecPlanner: it reads the planner's options, step count, calibration and
stage 2's grid (`_stage2`) and prices by depth (`_by_depth`, which stage 2 writes).
"""

from __future__ import annotations

import math

import numpy as np

from .objective import StepCosts


class Exploration:
    """Decides when to probe deeper and when to visit a close, unmeasured rival depth."""

    def _init_explore(self) -> None:
        self._probe_depth = 0  # depth of the pending probe's proposal; 0: no probe pending
        self._last_probe_step = 0
        self._spent_since_probe = 0.0  # predicted ms of the steps planned since the last probe
        self._last_rival_step = 0
        self._floor_visit = 0  # steps left of a visit to the floor (lightspec._visit_floor)
        self._by_depth: tuple = ((), (), [])  # stage 2's prices by depth (for _rival)

    def _spend(self, step_ms: float) -> None:
        """A planned step (not a probe) adds its predicted ms to the next probe's budget."""
        if math.isfinite(step_ms):
            self._spent_since_probe += step_ms

    def _end_probe(self) -> None:
        """The pending probe is verified or dropped: the next one is budgeted from here."""
        self._probe_depth = 0
        self._last_probe_step = self.steps
        self._spent_since_probe = 0.0

    def _rival(self, best_depth: int, best_j: float) -> int | None:
        """A depth to visit instead of the best, so the whole-step calibration measures it:
        of the depths priced within `rival_window` of the best whose (bucket, depth) cell has
        fewer than 4 periods, the least measured (then the cheapest), at most once every
        `min_probe_interval` steps. A rival the model prices close may really be the better
        one (the model adds host time that the loop partly hides); this is how the
        calibration gets to compare them. A visit to the floor lasts `floor_visit` steps
        (lightspec._visit_floor): its first step only stops drafting."""
        window = self.options.rival_window
        if (not (self.options.calibrate and self.refresh_costs)  # nothing would measure it
                or window <= 0.0 or not math.isfinite(best_j)
                or self.options.explore_fraction <= 0.0  # exploration off: no visits either
                or self.steps - self._last_rival_step < self.options.min_probe_interval):
            return None
        depths, buckets, j = self._by_depth
        cal = self.calibration
        close = [(value, int(d)) for d, b, value in zip(depths.tolist(), buckets.tolist(), j)
                 if d != best_depth and value <= best_j * (1.0 + window)
                 and cal.samples(b, d) < 4]
        if not close:
            return None
        self._last_rival_step = self.steps
        # The least measured depth first, the cheapest among equals: a depth whose best bucket
        # moves as the calibration learns offers a fresh cell at each move, and taking the
        # cheapest rival kept such cells ahead of a floor never measured (priced by the common
        # bias alone) through 400 steps of drafting that ran 40% over its price.
        return min((cal.depth_samples(d), value, d) for value, d in close)[2]

    def _best_drafting(self) -> tuple[int, float]:
        """(depth, price) of the depth >= 1 stage 2 priced lowest, the shallower among equals
        ((the shallowest allowed, inf) if none is priced): what the floor is weighed against,
        and where a probe from the floor starts."""
        depths, _, prices = self._by_depth
        priced = [(p, d) for d, p in zip(list(depths), prices) if d > 0 and math.isfinite(p)]
        if not priced:
            return self.spec.draft_depths[0], math.inf
        price, depth = min(priced)
        return int(depth), price

    def _maybe_probe(self, costs: StepCosts, n: int, best_depth: int, best_j: float) -> int:
        """Depth of a probe to start now, or 0 if none is due or affordable."""
        if self.options.explore_fraction <= 0.0:
            return 0
        if self.steps - self._last_probe_step < self.options.min_probe_interval:
            return 0
        depths = self.spec.draft_depths
        if best_depth == 0:
            best_depth = self._best_drafting()[0]
        target = min(best_depth + 2, depths[-1])
        probe = next(d for d in depths if d >= target)
        g = self._stage2  # stage 2 priced the probe's depth at its full width
        row = int(np.flatnonzero(g.depths == probe)[0])
        last = int(np.flatnonzero(g.valid[row])[-1])
        tokens = min(max(g.u[row, last] * g.progress[row, last], n), g.full[row])
        # A probe still commits tokens; only what it costs beyond their going price is waste.
        extra = max(0.0, float(g.step_ms[row, last]) * float(g.scales[row, last])
                    - float(tokens) * best_j)
        affordable = extra <= self.options.explore_fraction * self._spent_since_probe
        return probe if affordable else 0
