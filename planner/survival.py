"""Prefix survival curves: s[j] = P(accept_len > j), and the fill they price (stats.py reads them).

Following LightLLM's final planner (lightspec-algorithm.md §3-4), s[j] is an EMA per depth fed
only by full-width steps (u = N(d+1)): a trimmed step verifies deep positions only for confident
requests and would bias s[j] upward for those and leave others unseen. The survival fill prices
a verify of u rows: the device fills depth 1 for every request, then depth 2, ...; each row at
depth j commits s[j] tokens.

Additions of ours:

* the fill uses the EMAs made non-increasing in j (weighted isotonic regression): depth j learns
  only from full-width steps of depth >= j, which a planner drafts when acceptance has been
  good, so the raw curve can rise with j (see levels());
* depths past the deepest measured one, m, continue its last conditional acceptance
  q = (s[m] / s[m'])^(1 / (m - m')) (m' the measured depth before m, s[0] = 1):
  s[j] = s[m] q^(j-m). LightLLM counts an unmeasured depth as 1.0, assuming the next full-width
  step measures it, but a depth is measured only by requests with room for the whole proposal:
  after steps of short requests (a warm-up of a few tokens, a batch near its ends) only depth 1
  may be known, every deeper depth then looks free, and the planner drafts deep through trimmed
  steps that never measure it (the tiny pair, math c=64: depth 5-7 for the first six steps
  after a 4-token warm-up). Probes still explore deeper depths at full width;
* sampling classes: acceptance depends on how a request samples (greedy vs a temperature;
  vLLM #57533), so a workload whose mix of greedy and sampled requests shifts would drag one
  shared curve around. The curve is kept per class as well as pooled, and the fill of a batch
  uses its classes' curves weighted by their share of its requests (the pooled curve for a
  class not yet measured; use_mix()). While every sample so far came from one class, that
  class's curve is the pooled one, kept once;
* a prior for small samples: a depth's first samples are averaged with prior_accept^j
  weighing prior_weight full-weight steps (LightSpecOptions: one request's worth). Without it
  the first full-width steps of a lone request set the curve outright: on the tiny pair
  (HumanEval, c=1) two that accepted 1 and 0 of 3 drafts priced every draft past the first at
  0, the fill trimmed those rows, and a trimmed row is never measured again - the planner
  verified 2 rows per step for good where 4 paid (benchmarks/policy_ab.py, forced depth 3);
* the batch's level (level.py): the pooled curves average many requests over hundreds of
  steps; at low concurrency the batch is a few requests whose acceptance sits above or below
  that average and drifts. A filtered logit offset, fed by the same full-width steps, moves
  the curve's conditional acceptances to the current batch's level (level_variance=0: off).

record() runs every step and the fill every planning step, on the host: the fitted curves are
cached until a sample, the class mix or the level moves them.
"""

from __future__ import annotations

import math

import numpy as np

from .level import LevelShift, outcomes


class SurvivalCurves:
    """Survival EMAs for depths 1..max_depth, pooled and per sampling class, and their fill."""

    def __init__(self, *, max_depth: int, decay: float, sample_floor: int,
                 level_rho: float = 0.95, level_variance: float = 0.0,
                 prior_weight: float = 0.0, prior_accept: float = 0.9) -> None:
        if prior_weight < 0 or not 0.0 < prior_accept <= 1.0:
            raise ValueError(f"prior_weight must be >= 0 and prior_accept in (0, 1], got "
                             f"{prior_weight}, {prior_accept}")
        self.max_depth = int(max_depth)
        self.decay = decay
        self.sample_floor = sample_floor
        # A depth's first sample is averaged with prior_accept^j of this weight (in full-weight
        # steps, sample_floor requests each); 0: the first sample stands alone.
        self.prior_weight = float(prior_weight)
        self.prior = prior_accept ** np.arange(self.max_depth + 1, dtype=np.float64)  # [K+1]
        # index j (1..K) used; NaN = never measured. pooled[j] = P(accept_len > j)
        self.pooled = np.full(self.max_depth + 1, np.nan)
        self.weights = np.zeros(self.max_depth + 1)  # sample weight seen per depth
        self.level = LevelShift(rho=level_rho, variance=level_variance)
        # sampling class -> [survival [K+1], weight [K+1]]
        self._by_class: dict[int, list[np.ndarray]] = {}
        self._class_fits: dict[int, np.ndarray] = {}  # class -> its fitted curve (cache)
        # The one class every sample so far came from, whose curve is then the pooled one;
        # None once a second class, or a sample without classes, arrives and the class gets a
        # curve of its own.
        self._alias: int | None = None
        self._mix: tuple[np.ndarray, np.ndarray] | None = None  # (classes, shares)
        # The fitted curve of the batch's classes before the level shift, cleared when a sample
        # or the class mix changes it; and after the shift, with its running sum, cleared also
        # when the level moves.
        self._base: np.ndarray | None = None
        self._through: int | None = None  # measured_through's answer: depths 1..t measured
        self._placements: dict[tuple, tuple] = {}  # _placement's cache
        self._filled: tuple[np.ndarray, np.ndarray] | None = None

    # ---- updates ---------------------------------------------------------------------------

    def record(self, accept: np.ndarray, depth: int, classes: np.ndarray | None) -> None:
        """One full-width step: accept [N'] tokens committed (bonus included) by the requests
        whose whole depth-`depth` proposal was verified; classes [N'] theirs, or None."""
        # [d] reached and passed at each position: the level and the pooled curve read both
        counted = outcomes(accept, depth) if accept.size and depth >= 1 else None
        if self.level.enabled and self.measured:  # predicted before this step counts
            self.level.update(self.base(), accept, depth, counted=counted)
        kinds = _kinds(classes)
        if self._alias is not None and kinds != [self._alias] and accept.size:
            self._own_curve()
        first = (self._alias is None and not self._by_class and len(kinds) == 1
                 and not self.weights.any())
        self._record(self.pooled, self.weights, accept, depth, counted)
        if first:
            self._alias = kinds[0]
        if self._alias is not None:
            self._class_fits.pop(self._alias, None)
        else:
            for c in kinds:
                curve = self._by_class.setdefault(c, [np.full(self.max_depth + 1, np.nan),
                                                      np.zeros(self.max_depth + 1)])
                self._record(curve[0], curve[1], accept[classes == c], depth)
                self._class_fits.pop(c, None)
        self._base = self._filled = self._through = None

    def admit(self, new: int, total: int) -> None:
        """`new` of the next batch's `total` requests have no acceptance history yet."""
        if self.level.enabled and new > 0:
            self.level.admit(new, total)
            self._filled = None

    def use_mix(self, mix: tuple[np.ndarray, np.ndarray] | None) -> None:
        """The batch's (classes, shares) the fill prices from now on; None: the pooled curve."""
        self._mix = mix
        self._base = self._filled = None

    def _own_curve(self) -> None:
        """The aliased class's curve becomes its own: a copy of the pooled one so far."""
        c, self._alias = self._alias, None
        self._by_class[c] = [self.pooled.copy(), self.weights.copy()]
        self._class_fits.pop(c, None)

    def _record(self, values: np.ndarray, weights: np.ndarray, accept: np.ndarray,
                depth: int, counted: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """One curve's EMAs; counted: outcomes(accept, depth) if the caller has them."""
        if accept.size:
            if counted is None:
                counted = outcomes(accept, depth)
            survived = counted[1] / accept.size  # [d]
            where = slice(1, depth + 1)
            if self.prior_weight > 0:  # a depth's first sample meets the prior
                fresh = np.isnan(values[where])
                values[where] = np.where(fresh, self.prior[where], values[where])
                weights[where] = np.where(fresh, self.prior_weight, weights[where])
            ema_update(values, weights, where, survived,
                       min(1.0, accept.size / self.sample_floor), self.decay)

    # ---- queries ---------------------------------------------------------------------------

    @property
    def measured(self) -> bool:
        """Whether any depth has been measured."""
        return bool(np.isfinite(self.pooled[1:]).any())

    def measured_through(self, depth: int) -> bool:
        """Whether every depth 1..depth has been measured."""
        if self._through is None:  # depths 1..t measured (the fill asks for each depth)
            unmeasured = np.flatnonzero(~np.isfinite(self.pooled[1:]))
            self._through = int(unmeasured[0]) if unmeasured.size else self.max_depth
        return min(depth, self.max_depth) <= self._through

    def has_class(self, c: int) -> bool:
        return c in self._by_class or c == self._alias

    def levels(self) -> tuple[np.ndarray, np.ndarray]:
        """(s, S): the survival the fill uses, and S[f] = s[1] + ... + s[f].

        s is the measured survival made non-increasing (weighted isotonic regression), with
        depths past the deepest measured one extrapolated (fit), and 1.0 everywhere before
        the first measurement. P(accept_len > j) cannot grow with j, but the per-depth EMAs
        can: depth j is fed only by full-width steps of depth >= j, and a planner drafts deep
        when acceptance has been good, so deep depths see a luckier sample (on the tiny pair,
        ShareGPT at c=1: s[4] > s[3] and s[6] = 0.45 > s[5] = 0.29). Uncorrected, such a curve
        prices a deeper level's rows above shallower ones and draws the planner deep."""
        if self._filled is None:
            s = self.level.apply(self.base())
            self._filled = (s, np.cumsum(s))
        return self._filled

    def base(self) -> np.ndarray:
        """[K+1] the fitted survival of the batch's classes, before the level shift."""
        if self._base is None:
            if self._mix is None:
                self._base = self.fit(self.pooled, self.weights)
            else:  # the batch's classes, by their share of it (the pooled fit for the unseen)
                labels, shares = self._mix
                pooled = None
                s = 0.0
                for c, share in zip(labels.tolist(), shares.tolist()):
                    if not self.has_class(c) and pooled is None:
                        pooled = self.fit(self.pooled, self.weights)
                    s = s + share * (self.class_fit(c) if self.has_class(c) else pooled)
                self._base = s
        return self._base

    def class_fit(self, c: int) -> np.ndarray:
        """[K+1] one class's fitted curve (the class must have samples: has_class)."""
        fit = self._class_fits.get(c)
        if fit is None:
            values, weights = ((self.pooled, self.weights) if c == self._alias
                               else self._by_class[c])
            fit = self._class_fits[c] = self.fit(values, weights)
        return fit

    def fit(self, survival: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """[K+1] the fill's survival from per-depth EMAs ([K+1], NaN = unmeasured): measured
        depths made non-increasing, a gap between them at 1.0, and depths past the deepest
        measured one, m, at s[m] q^(j-m), q the conditional acceptance per depth between m and
        the measured depth before it (depth 0 when there is none: s[0] = 1)."""
        # Nine or so values, refitted on the host after every full-width step: plain floats.
        values, w = survival.tolist(), weights.tolist()
        idx = [j for j in range(1, len(values)) if math.isfinite(values[j])]  # measured
        s = [1.0] * len(values)
        if len(idx) > 1:
            cap = 1.0 / (1.0 - self.decay)  # an EMA's effective sample weight
            picked = [values[j] for j in idx]
            if any(b > a for a, b in zip(picked, picked[1:])):  # else the fit is the values
                picked = pooled(picked, [min(w[j], cap) for j in idx])
            for j, v in zip(idx, picked):
                s[j] = v
        elif idx:
            s[idx[0]] = values[idx[0]]
        if idx:
            m = idx[-1]
            before = idx[-2] if len(idx) > 1 else 0
            ref = s[before] if before else 1.0
            q = (s[m] / ref) ** (1.0 / (m - before)) if ref > 0 else 0.0
            for j in range(m + 1, len(s)):
                s[j] = s[m] * q ** (j - m)
        s[0] = 0.0
        return np.array(s)

    def _placement(self, n: int, u: np.ndarray, depth, room: np.ndarray | None) -> tuple:
        """_place(), kept for the last few questions: while no request's end is within reach
        a fresh plan asks the same ones as the one before it (the same N, candidates and
        depths), and only the curve has moved."""
        if room is not None and not (len(room) and np.min(room) >= self.max_depth):
            return _place(n, u, depth, room, self.max_depth)
        u = np.asarray(u)
        key = (n, u.shape, u.tobytes(), np.shape(depth), np.asarray(depth).tobytes())
        hit = self._placements.get(key)
        if hit is None:
            if len(self._placements) >= 16:
                self._placements.clear()
            hit = self._placements[key] = _place(n, u, depth, None, self.max_depth)
        return hit

    def fills(self, n: int, u: np.ndarray, depth, room: np.ndarray | None,
              shifted: tuple[bool, ...] = (True,)) -> list[np.ndarray]:
        """Progress (committed tokens per row) of verifying u rows of a depth-`depth` proposal
        for N requests, once per curve in `shifted` (True: the batch's level, False: the
        pooled one before its shift), which share where the rows land.

        The fill goes level by level: depth 1 for every request, then depth 2, ...; each row at
        depth j commits s[j]. Level j holds c[j] rows, the requests with room for a j-th draft
        (all N without `room`, [N] drafts each can still use). With R[f] = c[1] + ... + c[f]
        rows in the first f levels and r = u - N draft rows to place: the f levels with
        R[f] <= r (at most d) commit sum_j c[j] s[j], and the r - R[f] rows of level f+1 commit
        s[f+1] each. depth: an int, or an int array broadcasting against u."""
        counts, full, partial, after, width = self._placement(n, u, depth, room)
        out = []
        for each in shifted:
            s = self.levels()[0] if each else self.base()
            gained = (counts * s).cumsum()  # [K+1] tokens of the first f levels
            out.append((n + gained[full] + partial * s[after]) / width)
        return out


def _place(n: int, u: np.ndarray, depth, room: np.ndarray | None, k: int) -> tuple:
    """Where fills() places u rows (see there): (c [K+1] rows per level, f the levels
    filled, the rows of level f+1, f+1 capped at K, the width to divide by)."""
    if room is None or (len(room) and np.min(room) >= k):  # no end within reach: all full
        counts = np.full(k + 1, n, dtype=np.int64)
    else:  # c[j] = #{i: room_i >= j}
        counts = np.bincount(np.minimum(np.asarray(room, dtype=np.int64), k),
                             minlength=k + 1)[::-1].cumsum()[::-1]
    counts[0] = 0
    rows = counts.cumsum()  # [K+1] R[f]
    levels = np.minimum(depth, k)
    r = np.minimum(np.maximum(u - n, 0), rows[levels])  # draft rows placed
    full = np.minimum(np.searchsorted(rows, r, side="right") - 1, levels)
    partial = r - rows[full]  # [C] rows of level full+1 (0 once every level is full)
    return counts, full, partial, np.minimum(full + 1, k), np.maximum(u, 1)


def _kinds(classes: np.ndarray | None) -> list[int]:
    """The distinct sampling classes of a step's requests, ascending ([] without classes).
    Nearly every step's requests share one class: checked first, a sort only when not."""
    if classes is None:
        return []
    c = np.asarray(classes)
    if c.size == 0:
        return []
    first = c.flat[0]
    return [int(first)] if (c == first).all() else np.unique(c).tolist()


def weighted_line(x, y, w) -> tuple[float, float, float]:
    """(mean x, mean y, slope) of the weighted least-squares line through points (x, y) with
    weights w (a slope of 0 when every x is the same). A handful of points, read by the
    planner every step: plain floats cost the host less than array calls."""
    x, y, w = (v if isinstance(v, list) else np.asarray(v, dtype=np.float64).tolist()
               for v in (x, y, w))
    total = sum(w)
    mean_x = sum(wi * xi for xi, wi in zip(x, w)) / total
    mean_y = sum(wi * yi for yi, wi in zip(y, w)) / total
    spread = sum(wi * (xi - mean_x) ** 2 for xi, wi in zip(x, w))
    slope = sum(wi * (xi - mean_x) * (yi - mean_y) for xi, yi, wi in zip(x, y, w))
    return mean_x, mean_y, (slope / spread if spread else 0.0)


def non_increasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted least-squares fit of a non-increasing sequence (pool adjacent violators)."""
    values = np.asarray(values, dtype=np.float64)
    if not (values[1:] > values[:-1]).any():  # nothing to pool: the fit is the sequence
        return values.copy()
    return np.array(pooled(values.tolist(), np.asarray(weights, np.float64).tolist()))


def non_decreasing(values: list[float]) -> list[float]:
    """Least-squares fit of a non-decreasing sequence, equal weights (pooled(), mirrored): the
    planner's expected tokens over a depth's candidate fills (LightSpecPlanner._grid), since a
    fill of more rows verifies a superset of a smaller one's positions (the top-B fill is
    nested) and never commits fewer tokens."""
    return [-v for v in pooled([-v for v in values], [1.0] * len(values))]


def pooled(values: list[float], weights: list[float]) -> list[float]:
    """non_increasing() on lists of floats (a handful of them, on the host every step)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, length]
    for v, w in zip(values, weights):
        blocks.append([v, max(w, 1e-12), 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [v for v, _, length in blocks for _ in range(length)]


def ema_update(values: np.ndarray, weights: np.ndarray, where: slice, sample: np.ndarray,
               share: float, decay: float) -> None:
    """Bias-corrected EMA in place: a mean of the samples until their weight reaches
    1 / (1 - decay), an EMA with alpha = share (1 - decay) after; NaN = never measured."""
    weights[where] += share
    alpha = share / np.minimum(weights[where], 1.0 / (1.0 - decay))
    old = values[where]
    values[where] = np.where(np.isnan(old), sample, old + alpha * (sample - old))
