"""The batch's acceptance level: a one-number correction of the pooled survival, tracked fast.

The pooled survival curve (survival.py) is an average over many requests and hundreds of steps.
At low concurrency that is the wrong conditioning: the batch is one to a few requests, and how
well the drafter does on *them*, now, is what the next step's depth should follow. Acceptance
varies by request (an easy prompt, a hard one) and drifts within one (boilerplate, then
reasoning); on the tiny pair and in the simulator's calibrated profiles both are large.

The correction keeps the pooled curve's shape and moves its level: each position's conditional
acceptance a[j] = s[j] / s[j-1] becomes sigmoid(logit(a[j]) + delta), one offset delta for the
batch. delta is a Kalman-filtered estimate in logit space (one dimension, extended filter):

* predict, once per learned step: delta <- rho * delta, var <- rho^2 var + (1 - rho^2) V / N,
  a mean-reverting drift whose stationary spread V / N is that of an N-request batch's mean
  deviation (V per request, an assumption; see LightSpecOptions.level_variance);
* update from the step's outcomes: every verified draft position up to each request's first
  rejection is a Bernoulli outcome y with predicted p = sigmoid(logit(a[j]) + delta); one
  Newton step from the prior, var <- 1 / (1 / var + sum p (1 - p)), delta += var * sum(y - p);
* new requests (admitted since the last step) pull delta toward 0 by their share of the batch,
  since nothing is known about them yet.

With many requests per step the pooled curve is itself fresh (every step feeds it N samples)
and delta's stationary spread V / N is small, so the correction fades by itself where it is
not needed. Only full-width steps feed it, for the reason the survival has (survival.py: a trimmed
step verifies deep positions only for confident requests).
"""

from __future__ import annotations

import numpy as np

_A_MIN, _A_MAX = 0.01, 0.99  # conditional acceptance bounds (as the fill clamps, fill.py)


class LevelShift:
    """Filtered logit offset delta of the current batch's acceptance against the pooled curve."""

    def __init__(self, *, rho: float, variance: float) -> None:
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"rho must be in [0, 1), got {rho}")
        if variance < 0.0:
            raise ValueError(f"variance must be >= 0, got {variance}")
        self.rho = float(rho)
        self.variance = float(variance)
        self.delta = 0.0
        self.var = 0.0  # posterior variance of delta; set by the first predict
        self._logits_of: tuple | None = None  # (survival array, its _logits): both read it

    def _base_logits(self, survival: np.ndarray) -> np.ndarray:
        """_logits(survival), kept for the curve last seen: the statistics hand update() and
        apply() the same fitted curve until a full-width step changes it."""
        seen = self._logits_of
        if seen is None or not np.array_equal(seen[0], survival):
            seen = self._logits_of = (np.array(survival, dtype=np.float64), _logits(survival))
        return seen[1]

    @property
    def enabled(self) -> bool:
        return self.variance > 0.0

    def admit(self, new: int, total: int) -> None:
        """`new` of the batch's `total` requests carry no history: shrink toward the prior."""
        if not self.enabled or new <= 0 or total <= 0:
            return
        keep = max(0.0, 1.0 - new / total)
        prior = self.variance / total
        self.delta *= keep
        self.var = keep * self.var + (1.0 - keep) * prior

    def update(self, survival: np.ndarray, accept_lens: np.ndarray, depth: int, *,
               counted: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """One full-width step: survival [K+1] the pooled fit (s[0] unused), accept_lens [N]
        tokens committed per request (bonus included) of a depth-`depth` proposal; counted:
        outcomes(accept_lens, depth) if the caller has them already."""
        accept = np.asarray(accept_lens, dtype=np.float64)
        n = accept.size
        if not self.enabled or n == 0 or depth < 1:
            return
        stationary = self.variance / n
        self.delta *= self.rho
        self.var = self.rho ** 2 * self.var + (1.0 - self.rho ** 2) * stationary
        base = self._base_logits(survival)[1:depth + 1]  # [d] logit a[j], j = 1..d
        p = _sigmoid(base + self.delta)  # [d]
        # [d] outcomes at each position up to the first rejection: seen, and of them accepted
        seen, accepted = outcomes(accept, depth) if counted is None else counted
        info = float(seen @ (p * (1.0 - p)))
        grad = float(accepted.sum() - seen @ p)
        self.var = 1.0 / (1.0 / max(self.var, 1e-12) + info)
        self.delta += self.var * grad

    def apply(self, survival: np.ndarray) -> np.ndarray:
        """The survival [K+1] with every conditional acceptance moved by delta (s[0] kept)."""
        if not self.enabled or self.delta == 0.0:
            return survival
        s = np.asarray(survival, dtype=np.float64)
        a = _sigmoid(self._base_logits(survival) + self.delta)  # [K+1]
        prev = np.concatenate([[1.0], s[1:-1]])
        a[1:] = np.where(s[1:] >= prev, 1.0, a[1:])  # no measured drop there: nothing to move
        out = s.copy()
        # A depth at 1.0 (nothing measured yet, SurvivalCurves.fit) stays 1.0: it keeps its pull.
        out[1:] = np.where(s[1:] == 1.0, 1.0, np.cumprod(a[1:]))
        return out


def outcomes(accept: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(reached [d], passed [d]): of the requests' accept lengths (bonus included) of a
    depth-d proposal, how many reached draft position j (accept >= j: verified up to it, the
    rejected one included) and how many passed it (accept > j: it was accepted), j = 1..d.
    A sort and two searches, not [N, d] comparisons: the survival and the level read them
    every step, on the host (for a few requests, plain comparisons cost it less still)."""
    if np.size(accept) <= 8:
        values = np.asarray(accept).tolist()
        reached = [sum(v >= j for v in values) for j in range(1, depth + 1)]
        passed = [sum(v > j for v in values) for j in range(1, depth + 1)]
        return np.array(reached, dtype=np.int64), np.array(passed, dtype=np.int64)
    a = np.sort(accept)
    j = np.arange(1, depth + 1)
    return (a.size - np.searchsorted(a, j, side="left"),
            a.size - np.searchsorted(a, j, side="right"))


def _logits(survival: np.ndarray) -> np.ndarray:
    """logit of the conditional acceptance a[j] = s[j] / s[j-1] (s[0] = 1), [K+1]."""
    s = np.asarray(survival, dtype=np.float64)
    prev = s[:-1].copy()  # [K] s[j-1], j = 1..K
    prev[0] = 1.0
    a = np.full(prev.shape, _A_MIN)
    np.divide(s[1:], prev, out=a, where=prev > 0)
    a = np.fmin(np.fmax(a, _A_MIN), _A_MAX)  # fmax drops a NaN (an unmeasured depth) for _A_MIN
    out = np.zeros(s.shape)
    out[1:] = np.log(a) - np.log1p(-a)
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
