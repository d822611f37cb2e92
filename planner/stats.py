"""Acceptance statistics: how many tokens a verify of u rows commits.

Progress p(N, u, d) = committed tokens per verified row (bonus included), so a step with u rows
is expected to commit u * p tokens. Following LightLLM's final planner (lightspec-algorithm.md
§3-4):

* an EMA of p keyed by the executed (N, u, d): ONE sample per step, sum(accept_lens) / u —
  per-request samples would make adaptation speed depend on concurrency;
* a per-depth prefix survival s[j] = P(accept_len > j), updated only from full-width steps
  (u = N(d+1)): a trimmed step verifies deep positions only for confident requests and would
  bias s[j] upward for those and leave others unseen;
* for an unseen key, the survival fill: the device fills depth 1 for every request, then depth
  2, ...; each row at depth j commits s[j] tokens (LightLLM counts an unmeasured depth as
  1.0, which makes unexplored depths look attractive once; we extrapolate, see below).

Additions of ours:

* full-width keys use the survival fill, not their own EMA: at u = N(d+1) every row is
  verified, so the fill is exact in expectation, and survival is fed by every full-width step at
  any depth while a key's EMA only by steps at that very key;
* weights: a step with N requests counts as w = min(1, N / sample_floor) steps, and every
  average is a bias-corrected EMA — alpha = w / min(W, 1 / (1 - decay)) with W the weight seen
  so far — so a young estimate is the plain mean of its samples and an old one an EMA with
  alpha = w (1 - decay). LightLLM starts the EMA at the first sample and moves it by 1 - decay
  whatever N is; at N = 1 that is one 0/1 outcome per step, the first of which stands almost
  alone for ten steps and later ones leave it ~20% noisy — enough to flip the depth choice.
  From N = sample_floor on, and once W >= 1 / (1 - decay), the update is LightLLM's. The same
  weight decides how far an exact key's EMA replaces the fill estimate: by min(1, W), so a key
  counts fully once it has seen sample_floor requests. LightLLM uses a key from its first
  sample; at N = 1 that one 0/1 outcome would replace the fill outright, and a key that started
  unlucky is then never chosen again to be corrected (on the tiny pair, ShareGPT at c=1, keys
  seen by fewer than 16 requests sat 0.17 tokens/row from the fill on average);
* the fill uses the survival EMAs made non-increasing in j (weighted isotonic regression):
  depth j learns only from full-width steps of depth >= j, which a planner drafts when
  acceptance has been good, so the raw curve can rise with j (see _levels);
* depths past the deepest measured one, m, continue its last conditional acceptance
  q = (s[m] / s[m'])^(1 / (m - m')) (m' the measured depth before m, s[0] = 1):
  s[j] = s[m] q^(j-m). LightLLM's 1.0 assumes the next full-width step measures them, but a
  depth is measured only by requests with room for the whole proposal: after steps of short
  requests (a warm-up of a few tokens, a batch near its ends) only depth 1 may be known, every
  deeper depth then looks free, and the planner drafts deep through trimmed steps that never
  measure it (the tiny pair, math c=64: depth 5-7 for the first six steps after a 4-token
  warm-up). Probes still explore deeper depths at full width;
* staleness: an EMA entry's weight halves every `half_life` steps since its last update and the
  remainder goes to the fill estimate, which exploration probes keep current. Without this a key
  measured long ago, when acceptance was different, would outvote fresh survival data forever.
* sampling classes: acceptance depends on how a request samples (greedy vs a temperature;
  vLLM #57533), so a workload whose mix of greedy and sampled requests shifts would drag one
  shared estimate around. Requests carry a class (the engine's: greedy, or a temperature band);
  the survival is kept per class as well as pooled, the fill of a batch uses its classes'
  curves weighted by their share of its requests (the pooled curve for a class not yet
  measured), and exact-key EMAs are keyed by the batch's class too (-1: a mixed batch).
  set_batch() tells the statistics which batch the next estimates are for;
* the batch's level (level.py): the pooled curves average many requests over hundreds of
  steps; at low concurrency the batch is a few requests whose acceptance sits above or below
  that average and drifts. A filtered logit offset, fed by the same full-width steps, moves
  the curve's conditional acceptances to the current batch's level (level_variance=0: off);
* estimator="interpolate" (ablation, after LightLLM's first commit b1623cad3, §10): per-length
  ratios r[l] = E[min(accepted, l)] / l from every eligible step, interpolated linearly in
  fractional draft rows per request s = u/N - 1, blended with the EMA by sample count
  (w = count / blend_samples). We interpolate the accepted count A(l) = l r[l] with A(0) = 0
  rather than r itself, so that s < 1 does not discount the rows it does verify.
"""

from __future__ import annotations

import numpy as np

from .level import LevelShift

ESTIMATORS = ("survival", "interpolate")


class AcceptanceStats:
    """Running acceptance statistics for depths 1..max_depth."""

    def __init__(self, *, max_depth: int, progress_decay: float = 0.9,
                 survival_decay: float = 0.9, ratio_decay: float = 0.95,
                 estimator: str = "survival", blend_samples: int = 10,
                 half_life: float | None = None, sample_floor: int = 1,
                 full_width_from_survival: bool = False, level_rho: float = 0.95,
                 level_variance: float = 0.0) -> None:
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        for name, value in (("progress_decay", progress_decay), ("survival_decay", survival_decay),
                            ("ratio_decay", ratio_decay)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if blend_samples < 1:
            raise ValueError(f"blend_samples must be >= 1, got {blend_samples}")
        if sample_floor < 1:
            raise ValueError(f"sample_floor must be >= 1 request, got {sample_floor}")
        if half_life is not None and not half_life > 0:
            raise ValueError(f"half_life must be > 0 steps or None, got {half_life}")
        self.max_depth = int(max_depth)
        self.progress_decay = progress_decay
        self.survival_decay = survival_decay
        self.ratio_decay = ratio_decay
        self.estimator = estimator
        self.blend_samples = blend_samples
        self.half_life = half_life
        self.sample_floor = sample_floor
        self.full_width_from_survival = full_width_from_survival
        # (N, u, d) -> [progress EMA, sample count, step of last update, weight seen]
        self._progress: dict[tuple[int, int, int], list] = {}
        # (N, d) -> {u: the same entry}: plan() asks for every u at one (N, d)
        self._by_nd: dict[tuple[int, int], dict[int, list]] = {}
        # Survival caches (see _levels): the fitted curve before the level shift, cleared when
        # the measured survival or the batch's class mix changes; and after it, with its
        # running sum, cleared also when the level moves.
        self._base: np.ndarray | None = None
        self._filled: tuple[np.ndarray, np.ndarray] | None = None
        self.level = LevelShift(rho=level_rho, variance=level_variance)
        # sampling class -> [survival [K+1], weight [K+1]]; the pooled curve is self.survival
        self._by_class: dict[int, list[np.ndarray]] = {}
        self._class_fits: dict[int, np.ndarray] = {}  # class -> its fitted curve (cache)
        # The one class every survival sample so far came from, whose curve is then the pooled
        # one (kept once, not twice: record() runs every step); None once a second class, or
        # a sample without classes, arrives and the class gets a curve of its own.
        self._alias: int | None = None
        self._batch_key = 0  # the planned batch's class, -1 if mixed (set_batch)
        self.batch_version = 0  # bumped whenever set_batch changes the class mix
        self._batch_mix: tuple[np.ndarray, np.ndarray] | None = None  # (classes, shares)
        # index j (1..K) used; NaN = never measured. survival[j] = P(accept_len > j)
        self.survival = np.full(self.max_depth + 1, np.nan)
        self.ratio = np.full(self.max_depth + 1, np.nan)  # r[l], l = 1..K
        self._survival_weight = np.zeros(self.max_depth + 1)
        self._ratio_weight = np.zeros(self.max_depth + 1)

    # ---- updates ---------------------------------------------------------------------------

    def record(self, *, num_requests: int, fill_rows: int, depth: int, accept_lens: np.ndarray,
               verify_lens: np.ndarray | None, step: int, full_width: bool | None = None,
               classes: np.ndarray | None = None,
               uncensored: np.ndarray | None = None) -> None:
        """Fold one executed step into the statistics (callers apply the skip rule first).

        full_width: the step verified every row its requests could use (its plan's
        `full_rows`); default: fill_rows == N (d + 1). At a full-width step the survival
        learns from the requests whose whole proposal was verified (verify_lens == d + 1): a
        request whose rows were cut by its remaining allowance is censored, and counting it
        would bias the deep positions' survival toward the requests that keep going.
        classes: [N] sampling class of each request (see the module notes), or None (all 0).
        uncensored: [N] bool, the requests the survival counts (StepObservation.uncensored);
        None: verify_lens == d + 1.
        """
        accept = np.asarray(accept_lens, dtype=np.float64)  # [N]
        key = (int(num_requests), int(fill_rows), int(depth), _batch_key(classes))
        sample = float(accept.sum()) / fill_rows
        share = min(1.0, num_requests / self.sample_floor)  # this step's weight, in steps
        entry = self._progress.get(key)
        if entry is None:
            entry = self._progress[key] = [0.0, 0, step, 0.0]
            self._by_nd.setdefault((key[0], key[2], key[3]), {})[key[1]] = entry
        entry[3] += share
        alpha = share / min(entry[3], 1.0 / (1.0 - self.progress_decay))
        entry[0] += alpha * (sample - entry[0])
        entry[1] += 1
        entry[2] = step
        if full_width is None:
            full_width = fill_rows == num_requests * (depth + 1)
        if full_width:
            if uncensored is not None:
                whole = np.asarray(uncensored, bool)  # [N] uncensored requests
            else:
                whole = np.ones(accept.shape, bool) if verify_lens is None else (
                    np.asarray(verify_lens) == depth + 1)
            if self.level.enabled and self.has_survival:  # predicted before this step counts
                self.level.update(self._base_curve(), accept[whole], depth)
            labels = None if classes is None else np.asarray(classes)[whole]
            kinds = [] if labels is None else np.unique(labels).tolist()
            if self._alias is not None and kinds != [self._alias] and whole.any():
                self._own_curve()
            first = (self._alias is None and not self._by_class and len(kinds) == 1
                     and not self._survival_weight.any())
            self._record_survival(self.survival, self._survival_weight, accept[whole], depth)
            if first:
                self._alias = kinds[0]
            if self._alias is not None:
                self._class_fits.pop(self._alias, None)
            else:
                for c in kinds:
                    curve = self._by_class.setdefault(c, [np.full(self.max_depth + 1, np.nan),
                                                          np.zeros(self.max_depth + 1)])
                    self._record_survival(curve[0], curve[1], accept[whole][labels == c], depth)
                    self._class_fits.pop(c, None)
            self._base = self._filled = None
            if verify_lens is None:
                verify_lens = np.full(accept.shape, depth + 1)
        if verify_lens is not None and self.estimator == "interpolate":
            self._record_ratios(accept, np.asarray(verify_lens), share)  # only it reads them

    def _own_curve(self) -> None:
        """The aliased class's curve becomes its own: a copy of the pooled one so far."""
        c, self._alias = self._alias, None
        self._by_class[c] = [self.survival.copy(), self._survival_weight.copy()]
        self._class_fits.pop(c, None)

    def _has_class(self, c: int) -> bool:
        return c in self._by_class or c == self._alias

    def _record_survival(self, values: np.ndarray, weights: np.ndarray, accept: np.ndarray,
                         depth: int) -> None:
        if accept.size:
            j = np.arange(1, depth + 1)
            survived = (accept[None, :] > j[:, None]).mean(axis=1)  # [d]
            _update(values, weights, slice(1, depth + 1), survived,
                    min(1.0, accept.size / self.sample_floor), self.survival_decay)

    def admit(self, new: int, total: int) -> None:
        """`new` of the next batch's `total` requests have no acceptance history yet."""
        if self.level.enabled and new > 0:
            self.level.admit(new, total)
            self._filled = None

    def set_batch(self, classes: np.ndarray | None) -> None:
        """The sampling classes ([N]) of the batch the next estimates are for (None: all 0)."""
        key = _batch_key(classes)
        mix = None
        if key == -1:
            labels, counts = np.unique(np.asarray(classes), return_counts=True)
            mix = (labels, counts / counts.sum())
        elif self._has_class(key):
            mix = (np.array([key]), np.ones(1))
        if key != self._batch_key or not _same_mix(mix, self._batch_mix):
            self._batch_key, self._batch_mix = key, mix
            self._base = self._filled = None
            self.batch_version += 1

    def _record_ratios(self, accept: np.ndarray, verify_lens: np.ndarray, share: float) -> None:
        drafts = verify_lens - 1  # [N] draft rows verified per request
        accepted = accept - 1.0  # [N]
        for l in range(1, min(int(drafts.max(initial=0)), self.max_depth) + 1):
            seen = drafts >= l
            sample = float(np.minimum(accepted[seen], l).mean()) / l
            _update(self.ratio, self._ratio_weight, slice(l, l + 1), np.array([sample]), share,
                    self.ratio_decay)

    # ---- queries ---------------------------------------------------------------------------

    @property
    def has_progress(self) -> bool:
        return bool(self._progress)

    @property
    def has_survival(self) -> bool:
        return bool(np.isfinite(self.survival[1:]).any())

    def entry(self, num_requests: int, fill_rows: int, depth: int, sampling_class: int = 0
              ) -> tuple[float, int] | None:
        """(EMA, sample count) for an exact key, or None if it was never recorded."""
        e = self._progress.get((num_requests, fill_rows, depth, sampling_class))
        return None if e is None else (e[0], e[1])

    def progress(self, num_requests: int, fill_rows: int, depth: int, *, now: int,
                 room: np.ndarray | None = None) -> float:
        """Expected committed tokens per verified row at (N, u, d); in (0, 1].

        room: [N] draft rows each request can still use (its remaining allowance less the bonus
        token), or None for no end in sight; the fill never places a row past it."""
        return float(self.progress_many(num_requests, np.array([fill_rows]), depth, now=now,
                                        room=room)[0])

    def progress_many(self, num_requests: int, fill_rows: np.ndarray, depth: int, *,
                      now: int, room: np.ndarray | None = None) -> np.ndarray:
        """progress() for several u at one (N, d); fill_rows: [C] ints in [N, N(d+1)]."""
        n = int(num_requests)
        u = np.asarray(fill_rows, dtype=np.int64)  # [C]
        prior = self._prior(n, u, depth, room)  # [C]
        out = prior.copy()
        if self._by_nd.get((n, int(depth), self._batch_key)):
            self._blend(out, prior, self._pooled_shift(prior, n, u, depth, room), n, u,
                        int(depth), now)
        return out

    def progress_grid(self, num_requests: int, fill_rows: np.ndarray, depths: np.ndarray, *,
                      now: int, room: np.ndarray | None = None) -> np.ndarray:
        """progress_many() for several depths at once: fill_rows [D, C], depths [D] -> [D, C]."""
        n = int(num_requests)
        u = np.asarray(fill_rows, dtype=np.int64)
        depths = np.asarray(depths, dtype=np.int64)
        if self.estimator == "interpolate" and np.isfinite(self.ratio[1:]).any():
            return np.stack([self.progress_many(n, u[i], int(d), now=now, room=room)
                             for i, d in enumerate(depths.tolist())])
        keyed = [self._by_nd.get((n, d, self._batch_key)) for d in depths.tolist()]
        if not self.has_survival:
            prior = np.ones(u.shape)
            shift = np.zeros(u.shape)
        elif any(keyed) and self._shifted():
            prior, base = self._survival_fills(n, u, depths[:, None], room, (True, False))
            shift = prior - base  # [D, C]
        else:
            prior = self._survival_fill(n, u, depths[:, None], room)
            shift = np.zeros(u.shape)
        out = prior.copy()
        for i, d in enumerate(depths.tolist()):
            if keyed[i]:
                self._blend(out[i], prior[i], shift[i], n, u[i], d, now)
        return out

    def _shifted(self) -> bool:
        """Whether the batch's level moves the survival fill (and so the keys' EMAs)."""
        return self.level.delta != 0.0 and self.has_survival and self.estimator == "survival"

    def _pooled_shift(self, prior: np.ndarray, n: int, u: np.ndarray, depth,
                      room: np.ndarray | None) -> np.ndarray:
        """What the batch's level adds to the fill estimate `prior` (0 without a shift): a
        key's EMA is a pooled-level figure, so the level moves it as it moves the fill."""
        if not self._shifted():
            return np.zeros(np.shape(prior))
        return prior - self._survival_fill(n, u, depth, room, shifted=False)

    def _blend(self, out: np.ndarray, prior: np.ndarray, shift: np.ndarray, n: int,
               u: np.ndarray, depth: int, now: int) -> None:
        """Moves out[i] (in place) to the exact-key EMA of (N, u[i], d) where one exists,
        moved by `shift` [C] (the batch's level)."""
        entries = self._by_nd.get((n, depth, self._batch_key))
        if not entries:
            return
        # the fill is exact at full width and better fed than one key's EMA
        skip = n * (depth + 1) if self.full_width_from_survival and (
            np.isfinite(self.survival[1:min(depth, self.max_depth) + 1]).all()) else None
        half_life, ratios = self.half_life, self.estimator == "interpolate"
        for i, rows in enumerate(u.tolist()):
            e = entries.get(rows)
            if e is None or rows == skip:
                continue
            weight = min(1.0, e[3])  # evidence: requests seen, in units of sample_floor
            if half_life is not None:
                weight *= 0.5 ** (max(0, now - e[2]) / half_life)
            if ratios:
                weight *= min(1.0, e[1] / self.blend_samples)
            out[i] = weight * (e[0] + shift[i]) + (1.0 - weight) * prior[i]

    def _prior(self, n: int, u: np.ndarray, depth: int, room: np.ndarray | None
               ) -> np.ndarray:
        """Estimate without an exact-key EMA: survival fill, interpolation, or 1.0."""
        if self.estimator == "interpolate" and np.isfinite(self.ratio[1:]).any():
            return self._interpolated(n, u, depth)
        if not self.has_survival:
            return np.ones(u.shape)
        return self._survival_fill(n, u, depth, room)

    def _levels(self) -> tuple[np.ndarray, np.ndarray]:
        """(s, S): the survival the fill uses, and S[f] = s[1] + ... + s[f].

        s is the measured survival made non-increasing (weighted isotonic regression), with
        depths past the deepest measured one extrapolated (_fit), and 1.0 everywhere before
        the first measurement. P(accept_len > j) cannot grow with j, but the per-depth EMAs
        can: depth j is fed only by full-width steps of depth >= j, and a planner drafts deep
        when acceptance has been good, so deep depths see a luckier sample (on the tiny pair,
        ShareGPT at c=1: s[4] > s[3] and s[6] = 0.45 > s[5] = 0.29). Uncorrected, such a curve
        prices a deeper level's rows above shallower ones and draws the planner deep."""
        if self._filled is None:
            s = self.level.apply(self._base_curve())
            self._filled = (s, np.cumsum(s))
        return self._filled

    def _base_curve(self) -> np.ndarray:
        """[K+1] the fitted survival of the batch's classes, before the level shift."""
        if self._base is None:
            if self._batch_mix is None:
                self._base = self._fit(self.survival, self._survival_weight)
            else:  # the batch's classes, by their share of it (the pooled fit for the unseen)
                labels, shares = self._batch_mix
                pooled = None
                s = 0.0
                for c, share in zip(labels.tolist(), shares.tolist()):
                    if not self._has_class(c) and pooled is None:
                        pooled = self._fit(self.survival, self._survival_weight)
                    s = s + share * (self._class_fit(c) if self._has_class(c) else pooled)
                self._base = s
        return self._base

    def _class_fit(self, c: int) -> np.ndarray:
        fit = self._class_fits.get(c)
        if fit is None:
            values, weights = ((self.survival, self._survival_weight) if c == self._alias
                               else self._by_class[c])
            fit = self._class_fits[c] = self._fit(values, weights)
        return fit

    def _fit(self, survival: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """[K+1] the fill's survival from per-depth EMAs ([K+1], NaN = unmeasured): measured
        depths made non-increasing, a gap between them at 1.0, and depths past the deepest
        measured one, m, at s[m] q^(j-m), q the conditional acceptance per depth between m and
        the measured depth before it (depth 0 when there is none: s[0] = 1)."""
        measured = np.isfinite(survival)
        measured[0] = False
        s = np.where(measured, survival, 1.0)
        idx = np.flatnonzero(measured)
        if idx.size > 1:
            cap = 1.0 / (1.0 - self.survival_decay)  # an EMA's effective sample weight
            s[idx] = non_increasing(survival[idx], np.minimum(weights[idx], cap))
        if idx.size:
            m = int(idx[-1])
            before = int(idx[-2]) if idx.size > 1 else 0
            ref = s[before] if before else 1.0
            q = (s[m] / ref) ** (1.0 / (m - before)) if ref > 0 else 0.0
            tail = np.arange(m + 1, s.size)
            s[tail] = s[m] * q ** (tail - m)
        s[0] = 0.0
        return s

    def _survival_fill(self, n: int, u: np.ndarray, depth, room: np.ndarray | None = None, *,
                       shifted: bool = True) -> np.ndarray:
        """The fill level by level: depth 1 for every request, then depth 2, ...; each row at
        depth j commits s[j]. Level j holds c[j] rows, the requests with room for a j-th draft
        (all N without `room`). With R[f] = c[1] + ... + c[f] rows in the first f levels and
        r = u - N draft rows to place: the f levels with R[f] <= r (at most d) commit
        sum_j c[j] s[j], and the r - R[f] rows of level f+1 commit s[f+1] each.
        depth: an int, or an int array broadcasting against u. shifted=False: the pooled level,
        before the batch's level shift."""
        return self._survival_fills(n, u, depth, room, (shifted,))[0]

    def _survival_fills(self, n: int, u: np.ndarray, depth, room: np.ndarray | None,
                        shifted: tuple[bool, ...]) -> list[np.ndarray]:
        """_survival_fill for each curve in `shifted` (the batch's, the pooled one), sharing
        where the rows land: only what each row commits differs."""
        k = self.max_depth
        if room is None:
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
        after = np.minimum(full + 1, k)
        width = np.maximum(u, 1)
        out = []
        for each in shifted:
            s = self._levels()[0] if each else self._base_curve()
            gained = (counts * s).cumsum()  # [K+1] tokens of the first f levels
            out.append((n + gained[full] + partial * s[after]) / width)
        return out

    def _interpolated(self, n: int, u: np.ndarray, depth: int) -> np.ndarray:
        r = np.where(np.isfinite(self.ratio), self.ratio, 1.0)
        lengths = np.arange(self.max_depth + 1)
        accepted = lengths * r  # [K+1] A(l) = l r[l]
        accepted[0] = 0.0
        s = np.clip((u - n) / max(n, 1), 0.0, min(depth, self.max_depth))  # [C]
        a = np.interp(s, lengths, accepted)  # [C]
        return (n + n * a) / np.maximum(u, 1)


def _batch_key(classes: np.ndarray | None) -> int:
    """A batch's class: its requests' common class, 0 without classes, -1 if mixed."""
    if classes is None or len(classes) == 0:
        return 0
    first = int(classes[0])
    return first if (np.asarray(classes) == first).all() else -1


def _same_mix(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return (a[0].shape == b[0].shape and (a[0] == b[0]).all()
            and float(np.abs(a[1] - b[1]).max()) <= 0.02)


def non_increasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted least-squares fit of a non-increasing sequence (pool adjacent violators)."""
    values = np.asarray(values, dtype=np.float64)
    if not (values[1:] > values[:-1]).any():  # nothing to pool: the fit is the sequence
        return values.copy()
    blocks: list[list[float]] = []  # [weighted mean, weight, length]
    for v, w in zip(values.tolist(), np.maximum(weights, 1e-12).tolist()):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return np.repeat([b[0] for b in blocks], [b[2] for b in blocks])


def _update(values: np.ndarray, weights: np.ndarray, where: slice, sample: np.ndarray,
            share: float, decay: float) -> None:
    """Bias-corrected EMA in place: a mean of the samples until their weight reaches
    1 / (1 - decay), an EMA with alpha = share (1 - decay) after; NaN = never measured."""
    weights[where] += share
    alpha = share / np.minimum(weights[where], 1.0 / (1.0 - decay))
    old = values[where]
    values[where] = np.where(np.isnan(old), sample, old + alpha * (sample - old))
