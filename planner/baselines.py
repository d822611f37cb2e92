"""Baseline planners behind the same interface: static full width, DSpark-style capacity."""

from __future__ import annotations

import collections

import numpy as np

from .base import BasePlanner
from .costs import CostTable
from .fill import survival_scores
from .objective import candidate_rows, first_best
from .types import PlannerSpec, StepPlan


class StaticPlanner(BasePlanner):
    """Always draft `depth` tokens and verify every drafted row (classic fixed-K MTP/Eagle)."""

    name = "static"

    def __init__(self, spec: PlannerSpec, *, target_costs: CostTable | None = None,
                 draft_costs: CostTable | None = None, depth_costs: CostTable | None = None,
                 host_costs: CostTable | None = None, overlap: bool = True,
                 depth: int | None = None) -> None:
        super().__init__(spec, target_costs=target_costs, draft_costs=draft_costs,
                         depth_costs=depth_costs, host_costs=host_costs, overlap=overlap)
        self.depth = spec.draft_depths[-1] if depth is None else int(depth)
        if self.depth not in spec.draft_depths:
            raise ValueError(f"static depth {self.depth} is not an allowed draft depth "
                             f"{spec.draft_depths}")

    def _plan(self, *, n: int, m: int, d_prev: int, available: int,
              confidences: np.ndarray | None) -> StepPlan:
        return self._make(n=n, m=m, d_prev=d_prev, fill=available, depth=self.depth,
                          reason="static")


class DSparkPlanner(BasePlanner):
    """DSpark-style verify capacity from drafter confidences; always drafts the deepest depth.

    Over the candidate row counts u it maximises (N + sum of the top u-N prefix survivals) /
    (T_target(B) + T_draft(N, B, K)), survival = cumprod(clip(confidence, 0.01, 0.99)); ties keep
    the smaller u (DSpark Algorithm 1 with a global search, as in DSpark §5.2 and LightLLM's
    `DSparkPlanner`). The chosen u enters a FIFO of depth `capacity_delay`; once it is full the
    oldest entry is applied (clamped to [N, available]), so with the default 2 the capacity used
    at call i was computed at call i-1 from confidences the engine read then — themselves a step
    old under overlap: two steps in all. Until the FIFO fills, and without confidences or
    costs, it verifies full width.
    """

    name = "dspark"

    def __init__(self, spec: PlannerSpec, *, target_costs: CostTable | None = None,
                 draft_costs: CostTable | None = None, depth_costs: CostTable | None = None,
                 host_costs: CostTable | None = None, overlap: bool = True,
                 capacity_delay: int = 2) -> None:
        super().__init__(spec, target_costs=target_costs, draft_costs=draft_costs,
                         depth_costs=depth_costs, host_costs=host_costs, overlap=overlap)
        if capacity_delay < 1:
            raise ValueError(f"capacity_delay must be >= 1 call, got {capacity_delay}")
        self.capacity_delay = int(capacity_delay)
        self._fifo: collections.deque[int] = collections.deque()

    def _plan(self, *, n: int, m: int, d_prev: int, available: int,
              confidences: np.ndarray | None) -> StepPlan:
        depth = self.spec.draft_depths[-1]
        if confidences is None or not self.has_costs or d_prev == 0:
            return self._make(n=n, m=m, d_prev=d_prev, fill=available, depth=depth,
                              reason="cold")
        self._fifo.append(self._capacity(n, d_prev, available, confidences))
        if len(self._fifo) < self.capacity_delay:
            return self._make(n=n, m=m, d_prev=d_prev, fill=available, depth=depth,
                              reason="cold")
        fill = min(max(self._fifo.popleft(), n), available)
        return self._make(n=n, m=m, d_prev=d_prev, fill=fill, depth=depth, reason="capacity")

    def _capacity(self, n: int, d_prev: int, available: int, confidences: np.ndarray) -> int:
        conf = np.asarray(confidences, dtype=np.float64)
        if conf.ndim != 2:
            raise ValueError(f"confidences must be a [N, depth] array, got shape {conf.shape}")
        conf = conf[:, :d_prev]  # [N', d_prev]
        # NaN or <= 0 marks a missing draft token; a missing token ends that request's prefix.
        proposal_len = np.cumprod(np.nan_to_num(conf, nan=0.0) > 0.0, axis=1).sum(axis=1)
        survival = survival_scores(conf, proposal_len)  # [N', d_prev]
        scores = np.sort(survival[np.isfinite(survival)])[::-1]  # [S] descending
        gains = np.concatenate([[0.0], np.cumsum(scores)])  # [S+1] tokens from top-k rows
        limit = min(available, n + scores.size)
        u, buckets = candidate_rows(self.spec, n, limit)
        costs = self._costs(n)
        tokens = n + gains[np.minimum(u - n, scores.size)]  # [C]
        rate = tokens / costs.step_ms(buckets, self.spec.draft_depths[-1])
        return int(u[first_best(rate, maximize=True)])
