"""The oracle: an upper bound that knows how many drafts each request will have accepted.

Each step it picks the draft depth d (as if drafted last step, knowing the outcome) and a verify
bucket, and verifies only rows that will be accepted, so every verified row commits a token.
All requests must be served, so the best policy minimises the decode time for a fixed number
of tokens, and the best ratio for one step is not the best choice for that sum. It maximises
tokens - lam * ms instead, with lam its recent decode rate (Dinkelbach's method; lam is an EMA
over ~50 steps of committed tokens per decode ms — prefill time is the same under every policy
and left out — because the attainable rate changes with the batch). It uses the true cost
model, not a learned table, and the same buckets and draft-cost structure as the planners.
It is a per-step hindsight bound, not a proof of optimality.

The informed oracle (InformedOracle) chooses the same way without hindsight: it knows each
request's acceptance probabilities this step, not whether its drafts will be accepted - a
reference for what a planner that learns acceptance from outcomes could reach; the gap
between the two oracles is what knowing the draws is worth.

It models what the planners face: a step's price is its wall time, max(device, host) with an
overlapped loop and device + host without (objective.StepCosts.wall); requests near their end
cannot use drafts past their allowance (the caller caps `accepted`); and depth 0, the floor,
is a choice when the spec offers it (a verify of one row per request and no drafter forward,
as the simulator charges it: the engine's floor step only writes the drafter's cache).
"""

from __future__ import annotations

import numpy as np

from ..types import PlannerSpec


class Oracle:
    def __init__(self, spec: PlannerSpec, cost_model, *, decay: float = 0.98,
                 host: bool = True, overlap: bool = True) -> None:
        self.spec = spec
        self.cost = cost_model
        self.decay = decay
        self.host = host  # price the cost model's host time
        self.overlap = overlap
        self.tokens = 0.0  # EMA of tokens committed per decode step
        self.ms = 0.0  # EMA of decode ms (target + draft) per step

    def choose(self, accepted: np.ndarray, *, context: float) -> tuple[int, int, np.ndarray]:
        """(draft depth d, bucket B, verified drafts per request [N]) for this step.

        accepted: [N] drafts each request would get accepted (0 for a request without a
          proposal), already capped by what the request still needs.
        """
        n = accepted.shape[0]
        full = {d: min(n + int(np.minimum(accepted, d).sum()), self.spec.max_requests)
                for d in self.spec.choices}
        # Only rows that will be accepted are verified: each commits a token.
        depth, bucket, rows = self._best(n, full, lambda depth, rows: rows, context)
        return depth, bucket, _allocate(np.minimum(accepted, depth), rows - n)

    def _best(self, n: int, full: dict, tokens, context: float) -> tuple[int, int, int]:
        """(depth, bucket, rows) of the candidate with the best score: each depth d with each
        bucket from N's up to the one holding full[d] rows, verifying min(B, full[d]) rows
        that commit tokens(d, rows) tokens (in expectation for the informed oracle)."""
        spec = self.spec
        buckets = np.asarray(spec.verify_buckets)
        lo = int(np.searchsorted(buckets, n))
        n_bucket = int(buckets[lo])
        lam = self.tokens / self.ms if self.ms > 0 else None
        tail = self.cost.draft_ms(n_bucket, context, n)
        host = self.cost.host_ms(n) if self.host else 0.0
        verify, first = {}, {}  # bucket -> target ms, first draft forward ms
        best = None
        for depth in spec.choices:
            hi = int(np.searchsorted(buckets, full[depth]))
            for b in buckets[lo:hi + 1].tolist():
                rows = min(b, full[depth])
                got = tokens(depth, rows)
                if b not in verify:
                    verify[b] = self.cost.target_ms(b, context, n)
                    first[b] = self.cost.draft_ms(b, context, n)
                device = verify[b] + (first[b] + (depth - 1) * tail if depth > 0 else 0.0)
                ms = max(device, host) if self.overlap else device + host
                score = got - lam * ms if lam is not None else got / ms
                if best is None or score > best[0]:
                    best = (score, depth, b, rows)
        return best[1], best[2], best[3]

    def account(self, tokens: float, ms: float) -> None:
        first = self.ms == 0.0
        self.tokens = tokens if first else self.decay * self.tokens + (1 - self.decay) * tokens
        self.ms = ms if first else self.decay * self.ms + (1 - self.decay) * ms


def _allocate(accepted: np.ndarray, budget: int) -> np.ndarray:
    """Verified drafts per request: take accepted rows depth by depth until `budget` is spent."""
    verified = np.zeros_like(accepted)
    level = 0
    while budget > 0:
        level += 1
        grow = np.flatnonzero(accepted >= level)[:budget]
        if grow.size == 0:
            break
        verified[grow] += 1
        budget -= grow.size
    return verified


class InformedOracle(Oracle):
    """The oracle without hindsight: it knows every request's acceptance probabilities this
    step (the workload model's state, AcceptanceModel.survival), not the draws. It verifies
    the rows of highest survival and chooses depth and bucket, as the oracle does, for the
    most tokens they are expected to commit against its recent rate. No planner that learns
    acceptance from outcomes knows a request's state better; the drafter's confidences carry
    a little of each token's own draw, which this oracle does not read, so it is a reference
    without hindsight rather than a strict bound on the planners.

    `knows` how much of each request's latent state m + z it is told: "step" exactly;
    "last" the quality and last step's drift, this step's drift up to its innovation (AR(1));
    "request" the quality alone, the drift anywhere in its stationary spread; "filter" the
    quality, the drift as DriftFilter learns it from the outcomes (per slot, `slots` of them).
    """

    def __init__(self, spec: PlannerSpec, cost_model, *, model, knows: str = "step",
                 slots: int = 0, host: bool = True, overlap: bool = True) -> None:
        if knows not in ("step", "last", "request", "filter"):
            raise ValueError(f"an informed oracle knows 'step', 'last', 'request' or "
                             f"'filter', not {knows!r}")
        super().__init__(spec, cost_model, host=host, overlap=overlap)
        self.model, self.knows = model, knows
        self.tracker = DriftFilter(model, slots) if knows == "filter" else None
        self._at = None  # the tracker's survival at each grid drift, for learn()

    def admit(self, slots: np.ndarray) -> None:
        """Requests new in these slots (the filter starts over for them)."""
        if self.tracker is not None:
            self.tracker.admit(slots)

    def survival(self, slots: np.ndarray, quality: np.ndarray, before: np.ndarray,
                 now: np.ndarray, room: np.ndarray) -> np.ndarray:
        """[N, K] what it expects of each request's proposal this step, 0 past its `room` (the
        drafts it may still use): quality [N]; the drift a step ago and now, [N] each (the
        simulation's truth, read only as far as `knows` allows)."""
        k = self.spec.max_depth
        if self.tracker is not None:
            survival, self._at = self.tracker.survival(slots, quality, k)
        else:
            p = self.model.profile
            state, spread = {
                "step": (quality + now, 0.0),
                "last": (quality + p.drift_rho * before,
                         float(np.sqrt(1.0 - p.drift_rho ** 2) * p.drift_sigma)),
                "request": (quality, p.drift_sigma)}[self.knows]
            survival = self.model.survival(state, k, spread)
        return np.where(np.arange(1, k + 1)[None, :] <= room[:, None], survival, 0.0)

    def learn(self, slots: np.ndarray, verified: np.ndarray, accepted: np.ndarray) -> None:
        """The step's outcomes (`accepted` of `verified` drafts, [N] each): the filter's only
        source of the drift."""
        if self.tracker is not None:
            self.tracker.observe(slots, self._at, verified, accepted)

    def choose(self, survival: np.ndarray, *, context: float) -> tuple[int, int, np.ndarray]:
        """(draft depth d, bucket B, verified drafts per request [N]) for this step.

        survival: [N, K] P(drafts 1..j all accepted) per request, 0 past what it may still
          use (and everywhere for a request without a proposal); non-increasing along j.
        """
        n = survival.shape[0]
        full, expected = {}, {}
        for d in self.spec.choices:
            s = survival[:, :d]
            best_first = -np.sort(-s[s > 0])  # the rows worth verifying, best first
            full[d] = min(n + best_first.size, self.spec.max_requests)
            expected[d] = np.concatenate([[0.0], np.cumsum(best_first)])  # [rows - N]
        depth, bucket, rows = self._best(
            n, full, lambda depth, rows: n + float(expected[depth][rows - n]), context)
        verified = np.zeros(n, dtype=np.int64)
        if rows > n:
            # The top rows - N positions; ties keep request-major, position order, so each
            # request's verified positions are a prefix of its proposal.
            top = np.argsort(-survival[:, :depth], axis=None, kind="stable")[:rows - n]
            verified = np.bincount(top // depth, minlength=n)
        return depth, bucket, verified


class DriftFilter:
    """What a planner could know of each request's drift from its outcomes alone: a grid
    posterior over z per slot (the informed oracle `informed-filter`, which is also told each
    request's quality m and the drift's dynamics). Each step it predicts through the AR(1)
    (rho, stationary sd sigma), and after the step it weighs the grid by the likelihood of what
    the verified drafts showed: the first a accepted, then one rejected if a < verified.
    planner/synthetic.py draws them so, independent given m + z."""

    def __init__(self, model, slots: int, points: int = 121) -> None:
        p = model.profile
        self.model = model
        self.z = np.linspace(-4.0 * p.drift_sigma, 4.0 * p.drift_sigma, points)  # [G]
        prior = np.exp(-0.5 * (self.z / p.drift_sigma) ** 2)
        self.prior = prior / prior.sum()  # [G] the stationary drift
        sd = np.sqrt(1.0 - p.drift_rho ** 2) * p.drift_sigma
        move = np.exp(-0.5 * ((self.z[None, :] - p.drift_rho * self.z[:, None]) / sd) ** 2)
        self.move = move / move.sum(axis=1, keepdims=True)  # [G, G] from row to column
        self.posterior = np.tile(self.prior, (slots, 1))  # [C, G] after the last outcomes

    def admit(self, slots: np.ndarray) -> None:
        """New requests: nothing seen yet, their drift anywhere in its stationary spread."""
        self.posterior[slots] = self.prior

    def survival(self, slots: np.ndarray, quality: np.ndarray, k: int
                 ) -> tuple[np.ndarray, np.ndarray]:
        """([N, K] expected survival this step, [N, G, K] survival at each grid drift) for the
        requests in `slots` of quality [N]: the posterior moved one step on (predict)."""
        self.posterior[slots] = self.posterior[slots] @ self.move
        n, g = len(slots), self.z.size
        at = self.model.survival((quality[:, None] + self.z[None, :]).ravel(), k)
        at = at.reshape(n, g, k)
        return np.einsum("ng,ngk->nk", self.posterior[slots], at), at

    def observe(self, slots: np.ndarray, at: np.ndarray, verified: np.ndarray,
                accepted: np.ndarray) -> None:
        """A step's outcomes: `accepted` [N] of each request's `verified` [N] drafts accepted
        (its first rejection the next one, if any); `at` as survival() returned it."""
        n, g, k = at.shape
        with_one = np.concatenate([np.ones((n, g, 1)), at], axis=2)  # [N, G, K + 1] S(0..K)
        rows = np.arange(n)
        passed = with_one[rows, :, accepted]  # [N, G] S(a)
        rejected = accepted < verified
        nxt = with_one[rows, :, np.minimum(accepted + 1, k)]  # [N, G] S(a + 1)
        likelihood = np.where(rejected[:, None], passed - nxt, passed)  # P(exactly a | z)
        weighed = self.posterior[slots] * np.maximum(likelihood, 1e-300)
        self.posterior[slots] = weighed / weighed.sum(axis=1, keepdims=True)
