"""Acceptance statistics: how many tokens a verify of u rows commits.

Progress p(N, u, d) = committed tokens per verified row (bonus included), so a step with u rows
is expected to commit u * p tokens. Following LightLLM's final planner (lightspec-algorithm.md
§3-4):

* an EMA of p keyed by the executed (N, u, d): ONE sample per step, sum(accept_lens) / u —
  per-request samples would make adaptation speed depend on concurrency;
* a per-depth prefix survival s[j] = P(accept_len > j), updated from full-width steps
  (u = N(d+1)): a trimmed step verifies deep positions only for confident requests and would
  bias s[j] upward for those and leave others unseen (ours: a trimmed step still updates the
  depths every one of its requests had verified, survival_from_trimmed; a lookup drafter's
  short proposal verified whole was seen at every depth);
* for an unseen key, the survival fill: the device fills depth 1 for every request, then depth
  2, ...; each row at depth j commits s[j] tokens (LightLLM counts an unmeasured depth as
  1.0, which makes unexplored depths look attractive once; we extrapolate: survival.py).

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
* staleness: an EMA entry's weight halves every `half_life` steps since its last update and the
  remainder goes to the fill estimate, which exploration probes keep current. Without this a key
  measured long ago, when acceptance was different, would outvote fresh survival data forever.
* the survival curve is fitted (non-increasing, extrapolated past the deepest measured depth),
  kept per sampling class and moved to the batch's acceptance level: survival.py. Exact-key
  EMAs are keyed by the batch's class too (-1: a mixed batch); set_batch() tells the
  statistics which batch the next estimates are for;
* estimator="interpolate" (ablation, after LightLLM's first commit b1623cad3, §10): per-length
  ratios r[l] = E[min(accepted, l)] / l from every eligible step, interpolated linearly in
  fractional draft rows per request s = u/N - 1, blended with the EMA by sample count
  (w = count / blend_samples). We interpolate the accepted count A(l) = l r[l] with A(0) = 0
  rather than r itself, so that s < 1 does not discount the rows it does verify.
"""

from __future__ import annotations

import numpy as np

from .survival import SurvivalCurves, ema_update

ESTIMATORS = ("survival", "interpolate")


class AcceptanceStats:
    """Running acceptance statistics for depths 1..max_depth."""

    def __init__(self, *, max_depth: int, progress_decay: float = 0.9,
                 survival_decay: float = 0.9, ratio_decay: float = 0.95,
                 estimator: str = "survival", blend_samples: int = 10,
                 half_life: float | None = None, sample_floor: int = 1,
                 full_width_from_survival: bool = False, level_rho: float = 0.95,
                 level_variance: float = 0.0, survival_from_trimmed: bool = False,
                 prior_weight: float = 0.0, prior_accept: float = 0.9) -> None:
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
        self.curves = SurvivalCurves(max_depth=self.max_depth, decay=survival_decay,
                                     sample_floor=sample_floor, level_rho=level_rho,
                                     level_variance=level_variance,
                                     prior_weight=prior_weight, prior_accept=prior_accept)
        self.survival_from_trimmed = survival_from_trimmed
        self._batch_key = 0  # the planned batch's class, -1 if mixed (set_batch)
        self.batch_version = 0  # bumped whenever set_batch changes the class mix
        self._batch_mix: tuple[np.ndarray, np.ndarray] | None = None  # (classes, shares)
        self.ratio = np.full(self.max_depth + 1, np.nan)  # r[l], l = 1..K
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
            self.curves.record(accept[whole], depth,
                               None if classes is None else np.asarray(classes)[whole])
            if verify_lens is None:
                verify_lens = np.full(accept.shape, depth + 1)
        elif self.survival_from_trimmed and verify_lens is not None:
            # A trimmed step verified every request's first v drafts at least: those depths
            # were seen for all of them, whatever their confidences, and say as much as a
            # full-width step of depth v. (Deeper rows went to the confident requests only.)
            # A proposal shorter than the depth and verified whole (`uncensored`: an n-gram
            # lookup that found less) was seen at every depth: its missing drafts are misses.
            seen = np.asarray(verify_lens) - 1  # [N] drafts verified
            if uncensored is not None:
                seen = np.where(np.asarray(uncensored, bool), depth, seen)
            common = min(int(np.min(seen)), int(depth))
            if common >= 1:
                self.curves.record(accept, common, classes)
        if verify_lens is not None and self.estimator == "interpolate":
            self._record_ratios(accept, np.asarray(verify_lens), share)  # only it reads them

    def admit(self, new: int, total: int) -> None:
        """`new` of the next batch's `total` requests have no acceptance history yet."""
        self.curves.admit(new, total)

    def set_batch(self, classes: np.ndarray | None) -> None:
        """The sampling classes ([N]) of the batch the next estimates are for (None: all 0)."""
        key = _batch_key(classes)
        if key != -1 and key == self._batch_key and (
                (self._batch_mix is not None) == self.curves.has_class(key)):
            return  # one class again, measured or not as before: the same mix
        mix = None
        if key == -1:
            labels, counts = np.unique(np.asarray(classes), return_counts=True)
            mix = (labels, counts / counts.sum())
        elif self.curves.has_class(key):
            mix = (np.array([key]), np.ones(1))
        if key != self._batch_key or not _same_mix(mix, self._batch_mix):
            self._batch_key, self._batch_mix = key, mix
            self.curves.use_mix(mix)
            self.batch_version += 1

    def _record_ratios(self, accept: np.ndarray, verify_lens: np.ndarray, share: float) -> None:
        drafts = verify_lens - 1  # [N] draft rows verified per request
        accepted = accept - 1.0  # [N]
        for l in range(1, min(int(drafts.max(initial=0)), self.max_depth) + 1):
            seen = drafts >= l
            sample = float(np.minimum(accepted[seen], l).mean()) / l
            ema_update(self.ratio, self._ratio_weight, slice(l, l + 1), np.array([sample]),
                       share, self.ratio_decay)

    # ---- queries ---------------------------------------------------------------------------

    @property
    def has_progress(self) -> bool:
        return bool(self._progress)

    @property
    def has_survival(self) -> bool:
        return self.curves.measured

    @property
    def survival(self) -> np.ndarray:
        """[K+1] the pooled survival EMAs, survival[j] = P(accept_len > j); NaN = unmeasured."""
        return self.curves.pooled

    @property
    def level(self):
        """The batch's acceptance level (level.LevelShift)."""
        return self.curves.level

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
            prior, base = self.curves.fills(n, u, depths[:, None], room, (True, False))
            shift = prior - base  # [D, C]
        else:
            prior = self.curves.fills(n, u, depths[:, None], room)[0]
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
        return prior - self.curves.fills(n, u, depth, room, (False,))[0]

    def _blend(self, out: np.ndarray, prior: np.ndarray, shift: np.ndarray, n: int,
               u: np.ndarray, depth: int, now: int) -> None:
        """Moves out[i] (in place) to the exact-key EMA of (N, u[i], d) where one exists,
        moved by `shift` [C] (the batch's level)."""
        entries = self._by_nd.get((n, depth, self._batch_key))
        if not entries:
            return
        # the fill is exact at full width and better fed than one key's EMA
        skip = n * (depth + 1) if self.full_width_from_survival and (
            self.curves.measured_through(depth)) else None
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
            out[i] = weight * (e[0] + float(shift[i])) + (1.0 - weight) * float(prior[i])

    def _prior(self, n: int, u: np.ndarray, depth: int, room: np.ndarray | None
               ) -> np.ndarray:
        """Estimate without an exact-key EMA: survival fill, interpolation, or 1.0."""
        if self.estimator == "interpolate" and np.isfinite(self.ratio[1:]).any():
            return self._interpolated(n, u, depth)
        if not self.has_survival:
            return np.ones(u.shape)
        return self.curves.fills(n, u, depth, room)[0]

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
