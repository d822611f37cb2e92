"""Whole-step calibration: what a drafting step really costs the loop, relative to the floor.

The cost tables price a step from its parts: the verify bucket, the draft stage, host time.
Whatever the parts miss lands on the loop's wall clock only: on a CPU the host loop and the
"device" share two cores and slow each other down, and drafting adds a dispatch, a read of
the drafter's state and more bookkeeping. In one run on the tiny pair (ShareGPT, c=64,
benchmarks/diagnose_dynamic.py) drafting steps ran 9% over their prediction and floor steps
10% under theirs: a 1.2x relative error, larger than what separates the two regimes there,
always in speculation's favour.

So the engine reports each decode step's period - the wall time between two read-backs, the
real cost of a step in throughput terms - next to the plan it belongs to, and this keeps, per
regime (drafting or not), a bias-corrected EMA of log(period / predicted). The planner's
choice between the floor and drafting prices drafting steps at exp(drafting - floor) times
their modelled cost. Only the ratio matters: a bias common to both regimes moves no decision.
Both means fade toward zero with a half-life in steps, so a regime the planner stopped
visiting is trusted again after a while rather than avoided forever on old evidence; a
regime with fewer than `min_samples` periods gives no correction.
"""

from __future__ import annotations

import math


class RegimeCalibration:
    """log(measured / predicted) step time of drafting steps against floor steps."""

    def __init__(self, *, decay: float = 0.9, half_life: float = 512.0, min_samples: int = 4,
                 bounds: tuple[float, float] = (2.0 / 3.0, 1.5)) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0 steps, got {half_life}")
        self.decay = decay
        self.half_life = half_life
        self.min_samples = min_samples
        self.bounds = bounds
        # regime (True: drafting) -> [mean log ratio, samples, step of last sample]
        self._regimes = {False: [0.0, 0, 0], True: [0.0, 0, 0]}

    def observe(self, *, drafting: bool, predicted_ms: float, measured_ms: float,
                step: int) -> None:
        """One decode step: the plan's predicted wall ms and the loop's measured period."""
        if not (math.isfinite(predicted_ms) and math.isfinite(measured_ms)
                and predicted_ms > 0 and measured_ms > 0):
            return
        cell = self._regimes[bool(drafting)]
        cell[1] += 1
        alpha = max(1.0 / cell[1], 1.0 - self.decay)  # a mean until 1 / (1 - decay) samples
        cell[0] += alpha * (math.log(measured_ms / predicted_ms) - cell[0])
        cell[2] = step

    def drafting_scale(self, step: int) -> float:
        """Factor on a drafting step's modelled cost, relative to a floor step's (1.0 until
        both regimes have `min_samples` periods)."""
        means = []
        for cell in self._regimes.values():
            if cell[1] < self.min_samples:
                return 1.0
            means.append(cell[0] * 0.5 ** (max(0, step - cell[2]) / self.half_life))
        floor, drafting = means
        lo, hi = self.bounds
        return min(max(math.exp(drafting - floor), lo), hi)
