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
            rows = min(n + int(np.minimum(accepted, depth).sum()), spec.max_requests)
            hi = int(np.searchsorted(buckets, rows))
            for b in buckets[lo:hi + 1].tolist():
                tokens = min(b, rows)
                if b not in verify:
                    verify[b] = self.cost.target_ms(b, context, n)
                    first[b] = self.cost.draft_ms(b, context, n)
                device = verify[b] + (first[b] + (depth - 1) * tail if depth > 0 else 0.0)
                ms = max(device, host) if self.overlap else device + host
                score = tokens - lam * ms if lam is not None else tokens / ms
                if best is None or score > best[0]:
                    best = (score, depth, b, tokens)
        _, depth, bucket, tokens = best
        return depth, bucket, _allocate(np.minimum(accepted, depth), tokens - n)

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
