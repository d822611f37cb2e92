"""Whole-step calibration: what a step really costs the loop, against what its parts predict.

The cost tables price a step from its parts: the verify bucket, the draft stage, host time.
Whatever the parts miss lands on the loop's wall clock only. On a CPU the host loop and the
"device" share two cores: at low concurrency the host's work mostly hides under the device's
(the model, which adds them, overprices every step by about the host time, which flatters
deep steps: more tokens to spread a fixed cost over), at high concurrency they slow each other
down, and drafting adds a dispatch and bookkeeping. In one run on the tiny pair (ShareGPT,
c=64, benchmarks/diagnose_dynamic.py) drafting steps ran 9% over their prediction and floor
steps 10% under theirs: a relative error larger than what separates the two regimes there,
always in speculation's favour.

So the engine reports each decode step's period - the wall time between its read-back and the
previous one, the real cost of a step in throughput terms - next to the plan it belongs to.
That interval holds the previous step's drafting and this step's verify, which is what the
plan's predicted_ms prices (the verify at its bucket, the draft at the depth it verifies).
This keeps a bias-corrected EMA of log(period / predicted) per cell (bucket B, depth d) and
per regime (drafting, d > 0, or the floor), and prices a step at exp(log ratio) times its
modelled cost: the cell's ratio blended with its regime's, and the regime's with the mean
over every step, each by its sample count, so a few noisy periods move little and an
unmeasured cell or regime takes the common bias (which moves no decision) rather than none:
on this CPU every measured step ran under the model, and pricing the unmeasured floor at
the model's own figure made it look dearer than the drafting it was never compared with. A
bias common to every step moves no decision; what moves decisions is how the regimes,
buckets and depths differ.
Old evidence fades toward zero with a half-life in steps, so a cell the planner stopped
visiting is trusted again after a while rather than avoided forever. A planner that sits in
one cell learns nothing about its rivals, so the planner visits a close rival whose cell is
unmeasured now and then (LightSpecPlanner._rival).
"""

from __future__ import annotations

import math

import numpy as np

from .survival import weighted_line


class StepCalibration:
    """log(measured / predicted) step time, per (bucket, depth) cell and per regime."""

    def __init__(self, *, decay: float = 0.9, half_life: float = 512.0, cell_prior: float = 4.0,
                 bounds: tuple[float, float] = (2.0 / 3.0, 1.5)) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0 steps, got {half_life}")
        self.decay = decay
        self.half_life = half_life
        self.cell_prior = cell_prior  # samples at which a cell counts as much as its regime
        self.lo, self.hi = math.log(bounds[0]), math.log(bounds[1])
        # key -> [mean log ratio, samples, step of last sample]; keys: (bucket, depth) cells and
        # the regimes False (the floor) and True (drafting)
        self._cells: dict = {}
        self.version = 0  # bumped per sample: plan() caches what it derives by it

    def observe(self, *, bucket: int, depth: int, predicted_ms: float, measured_ms: float,
                step: int) -> None:
        """One decode step: its bucket, the depth of the draft its interval ran, the plan's
        predicted wall ms and the loop's measured period."""
        if not (math.isfinite(predicted_ms) and math.isfinite(measured_ms)
                and predicted_ms > 0 and measured_ms > 0):
            return
        sample = math.log(measured_ms / predicted_ms)
        for key in ((int(bucket), int(depth)), depth > 0, "all"):
            cell = self._cells.setdefault(key, [0.0, 0, step])
            cell[1] += 1
            alpha = max(1.0 / cell[1], 1.0 - self.decay)  # a mean until 1/(1 - decay) samples
            cell[0] += alpha * (sample - cell[0])
            cell[2] = step
        self.version += 1

    def scale(self, bucket: int, depth: int, step: int) -> float:
        """Factor on the modelled wall ms of a step verifying `bucket` rows with drafting of
        `depth` (0: the floor): the cell's mean log ratio blended with its regime's by the
        cell's sample count, clipped to the bounds."""
        return float(self.grid([bucket], [depth], step)[0, 0])

    def grid(self, buckets, depths, step: int) -> np.ndarray:
        """[D, C] `scale` of every (depth, bucket) pair at once, as plan() prices them: each
        regime's value, then the few measured cells patched in."""
        buckets, depths = [int(b) for b in buckets], [int(d) for d in depths]
        regime = {False: self._shrunk(False, step), True: self._shrunk(True, step)}
        log_ratio = np.array([[regime[d > 0]] * len(buckets) for d in depths], float)
        col = {b: j for j, b in enumerate(buckets)}
        row = {d: i for i, d in enumerate(depths)}
        for key, cell in self._cells.items():
            if not isinstance(key, tuple) or key[0] not in col or key[1] not in row:
                continue
            i, j = row[key[1]], col[key[0]]
            w = cell[1] / (cell[1] + self.cell_prior)
            log_ratio[i, j] = w * self._mean(key, step) + (1.0 - w) * log_ratio[i, j]
        return np.exp(np.minimum(np.maximum(log_ratio, self.lo), self.hi))  # np.clip, cheaper

    def samples(self, bucket: int, depth: int) -> int:
        """Periods seen in a (bucket, depth) cell."""
        cell = self._cells.get((int(bucket), int(depth)))
        return 0 if cell is None else cell[1]

    def depth_samples(self, depth: int) -> int:
        """Periods seen at `depth`, over every bucket."""
        return sum(cell[1] for key, cell in self._cells.items()
                   if isinstance(key, tuple) and key[1] == depth)

    def _shrunk(self, key, step: int) -> float:
        """The regime's mean, weighed against the mean over every step by its sample count."""
        common = self._mean("all", step)
        cell = self._cells.get(key)
        if cell is None:
            return common
        w = cell[1] / (cell[1] + self.cell_prior)
        return w * self._mean(key, step) + (1.0 - w) * common

    def _mean(self, key, step: int) -> float:
        cell = self._cells.get(key)
        if cell is None:
            return 0.0
        return cell[0] * 0.5 ** (max(0, step - cell[2]) / self.half_life)


class HostOverlap:
    """How much of a step's host time the loop fails to hide, by batch size N.

    A step costs the loop max(device, host) + exposed * min(device, host) (objective.StepCosts):
    exposed = 0 when the smaller hides entirely under the larger (an accelerator with a step in
    flight), 1 when they add up. Neither end is right on a CPU, where the "device" computes on
    the cores the host loop runs on: at c=1 a tiny pair's host work hid under its device steps
    (math: static K=7 ran 8.2 ms per step, its device tables said 8.2, its host table 1.9),
    while at high concurrency host and device slow each other down. A fixed sum there priced
    every step about the host time high, which flattens the relative cost of depth (the same
    ms added to a 5 ms and an 8 ms step: deep steps look cheaper than they are), and
    StepCalibration's ratios cannot undo an additive error (one ratio per regime scales both
    steps alike). Measured side by side at c=1 on the tiny pair, learning it changed dynamic's
    throughput by no more than the noise (BENCHMARKS.md, eleventh session): the per-cell
    calibration had absorbed most of the error there. It stays because it is the loop's model.

    So the planner learns `exposed` from the loop's periods: each decode step's measured
    period P against the device and host ms its plan was priced with gives one sample
    (P - max) / min, clipped to [0, 1]; an EMA per N, blended with the prior (the engine's
    `hides_host_time`: 0 on an accelerator, 1 on the CPU) by sample count. An N never measured
    takes the nearest measured N within a factor 2, else the prior. Device tables refreshed
    from the same busy periods already hold the contention, so a device-bound loop learns
    exposed ~ 0, and a host-bound one (whose periods refresh no device table) learns how much
    device work the host still waits for.
    """

    def __init__(self, prior: float, *, prior_weight: float = 8.0, decay: float = 0.9) -> None:
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior must be in [0, 1], got {prior}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.prior = float(prior)
        self.prior_weight = float(prior_weight)
        self.decay = decay
        self._by_n: dict[int, list] = {}  # N -> [mean exposed share, samples]
        self._keys = np.zeros(0, np.int64)  # sorted measured N
        self._last: tuple | None = None  # (N, samples seen) -> value, plan() asks every step
        self._seen = 0

    def observe(self, *, num_requests: int, device_ms: float, host_ms: float,
                period_ms: float) -> None:
        """One decode step's measured period against its priced device and host ms."""
        low, high = min(device_ms, host_ms), max(device_ms, host_ms)
        if not (num_requests > 0 and low > 0 and math.isfinite(high)
                and math.isfinite(period_ms) and period_ms > 0):
            return
        sample = min(max((period_ms - high) / low, 0.0), 1.0)
        n = int(num_requests)
        cell = self._by_n.get(n)
        if cell is None:
            cell = self._by_n[n] = [0.0, 0]
            self._keys = np.array(sorted(self._by_n), np.int64)
        cell[1] += 1
        cell[0] += max(1.0 / cell[1], 1.0 - self.decay) * (sample - cell[0])
        self._seen += 1

    def exposed(self, num_requests: int) -> float:
        """The share of min(device, host) a step with N requests adds to the larger."""
        n = int(num_requests)
        if self._last is not None and self._last[0] == (n, self._seen):
            return self._last[1]
        value = self.prior
        if len(self._keys):
            i = int(np.argmin(np.abs(np.log(self._keys / max(n, 1)))))
            near = int(self._keys[i])
            if max(near, n) <= 2 * max(min(near, n), 1):
                mean, count = self._by_n[near]
                w = count / (count + self.prior_weight)
                value = w * mean + (1.0 - w) * self.prior
        self._last = ((n, self._seen), value)
        return value


class TokenCalibration:
    """How many drafts the steps verifying a depth-d proposal accepted, against the plan's
    prediction: the value side of the objective, as StepCalibration is its cost side.

    The survival fill predicts a step's committed tokens from curves fed by many steps, and a
    planner that chooses depth from those predictions verifies a deep proposal mostly when its
    estimates are high - the winner's curse of any choice made on noisy estimates. On the tiny
    pair at c = 1 (benchmarks/diagnose_dynamic.py, 48 prompts, greedy) steps verifying depth 7
    accepted 3-10% fewer tokens than predicted (math 0.90, ShareGPT 0.93, HumanEval 0.97)
    while depth-2 and depth-3 steps accepted as many or more (0.99-1.07): an error that grows
    with depth, always in the deeper depth's favour. At c = 16 the ratios sat at 0.95-1.01.

    Per verified depth d it keeps decayed sums of the drafts accepted (committed tokens less
    the N bonus tokens) and of the drafts predicted, and reads their ratio with `prior_drafts`
    of agreement added to both: ten steps of a lone request move it about half way, one step
    of 16 requests as far (with 8, one noisy step of four requests tipped near-ties). The
    factors are the weighted line in depth through those ratios: in the simulator (math,
    c = 16) depth by depth they priced the depths the planner rarely visits at 0.84-0.93 and
    the ones it drafts at 0.97-0.99, where the visits, not the model, made the difference.
    The planner scales the drafts part of each depth's predicted tokens by them when it
    chooses the next depth (stage 2); its predictions stay the model's, so what is learned is
    the model's error, not an error of its own correction.
    """

    def __init__(self, *, decay: float = 0.98, prior_drafts: float = 32.0,
                 bounds: tuple[float, float] = (0.5, 1.5)) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if not prior_drafts > 0:
            raise ValueError(f"prior_drafts must be > 0, got {prior_drafts}")
        self.decay = decay
        self.prior_drafts = float(prior_drafts)
        self.lo, self.hi = bounds
        self._sums = np.zeros((0, 2))  # [K+1, 2] decayed (accepted, predicted) drafts by depth
        self.version = 0  # bumped per sample
        self._line: tuple | None = None  # (version, _fit()) of the last factors() call

    def observe(self, *, depth: int, predicted_drafts: float, accepted_drafts: float) -> None:
        """One verified depth-`depth` proposal: the drafts the plan predicted it would accept
        (its predicted tokens less N) and the drafts it accepted."""
        if depth < 1 or not (math.isfinite(predicted_drafts) and predicted_drafts >= 0
                             and math.isfinite(accepted_drafts) and accepted_drafts >= 0):
            return
        if depth >= len(self._sums):
            self._sums = np.vstack([self._sums, np.zeros((depth + 1 - len(self._sums), 2))])
        self._sums[depth] = self.decay * self._sums[depth] + (accepted_drafts, predicted_drafts)
        self.version += 1

    def factors(self, depths) -> np.ndarray:
        """[D] factors on the predicted drafts of proposals of each depth: the weighted
        least-squares line in depth through the measured depths' ratios (weights: their
        predicted drafts plus the prior), so that a depth the planner rarely visits - in the
        states that made it worth a visit - is priced from its neighbours as much as from its
        own few steps; 1 everywhere before any measurement."""
        depths = np.asarray(depths, np.int64)  # [D]
        if self._line is None or self._line[0] != self.version:
            self._line = (self.version, self._fit())
        line = self._line[1]
        if line is None:
            return np.ones(depths.shape)
        mean_d, mean_r, slope = line
        line = np.minimum(np.maximum(mean_r + slope * (depths - mean_d), self.lo), self.hi)
        return np.where(depths > 0, line, 1.0)

    def _fit(self) -> tuple[float, float, float] | None:
        """(mean depth, mean ratio, slope) of the weighted line, None before a measurement."""
        pts = [(float(d), (a + self.prior_drafts) / (p + self.prior_drafts),
                p + self.prior_drafts)
               for d, (a, p) in enumerate(self._sums.tolist()) if p > 0]  # (d, ratio, w)
        return weighted_line(*map(list, zip(*pts))) if pts else None
