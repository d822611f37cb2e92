"""Host-side speculative-decoding planners (numpy and the standard library only; never jax).

    spec = PlannerSpec(verify_buckets=geometric_buckets(N_max * (K + 1)),
                       draft_depths=tuple(range(1, K + 1)), max_depth=K)
    planner = make_planner("dynamic", spec, target_costs=CostTable({...}),
                           draft_costs=CostTable({...}))
    plan = planner.plan(num_requests=N, num_with_proposal=M)       # before the step
    planner.observe(StepObservation(plan=plan, accept_lens=...))   # after it (may lag a step)

See lightspec-algorithm.md in the project reference for the algorithm this follows.
"""

from __future__ import annotations

import dataclasses

from .base import BasePlanner
from .baselines import DSparkPlanner, StaticPlanner
from .costs import CostTable
from .lightspec import LightSpecPlanner
from .objective import draft_cost_ms
from .options import SERVING_REUSE, LightSpecOptions
from .stats import AcceptanceStats
from .types import (DrafterKind, PlannerSpec, StepObservation, StepPlan,
                    geometric_buckets)

PLANNER_KINDS = ("dynamic", "static", "dspark")


def make_planner(kind: str, spec: PlannerSpec, *, target_costs: CostTable | None = None,
                 draft_costs: CostTable | None = None, depth_costs: CostTable | None = None,
                 host_costs: CostTable | None = None, overlap: bool = True,
                 **options) -> BasePlanner:
    """Build a planner by name.

    depth_costs: optional ms of the drafting stage after the drafter's first forward, by depth
      (see BasePlanner); without it each further depth is priced as one draft forward over N.
    host_costs: optional host ms per step by requests N (refreshed by observe_host); with
      `overlap` a step costs max(device, host), without it their sum.
    kind: "dynamic" (alias "lightspec"): LightSpecPlanner; options are LightSpecOptions fields
      (estimator, progress_decay, survival_decay, stat_half_life, explore_fraction,
      min_probe_interval, refresh_costs).
      "static": StaticPlanner; option depth (default the deepest allowed depth).
      "dspark": DSparkPlanner; option capacity_delay (default 2).
    """
    kind = {"lightspec": "dynamic"}.get(kind, kind)
    if kind == "dynamic":
        allowed = {f.name for f in dataclasses.fields(LightSpecOptions)}
        _check_options(kind, options, allowed)
        return LightSpecPlanner(spec, target_costs=target_costs, draft_costs=draft_costs,
                                depth_costs=depth_costs, host_costs=host_costs,
                                overlap=overlap, options=LightSpecOptions(**options))
    if kind == "static":
        _check_options(kind, options, {"depth"})
        return StaticPlanner(spec, target_costs=target_costs, draft_costs=draft_costs,
                             depth_costs=depth_costs, host_costs=host_costs, overlap=overlap,
                             **options)
    if kind == "dspark":
        _check_options(kind, options, {"capacity_delay"})
        return DSparkPlanner(spec, target_costs=target_costs, draft_costs=draft_costs,
                             depth_costs=depth_costs, host_costs=host_costs, overlap=overlap,
                             **options)
    raise ValueError(f"unknown planner {kind!r}; choose one of {PLANNER_KINDS} (or 'lightspec')")


def _check_options(kind: str, options: dict, allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for planner {kind!r}; "
                         f"allowed: {sorted(allowed)}")


__all__ = [
    "AcceptanceStats", "BasePlanner", "CostTable", "DSparkPlanner", "DrafterKind",
    "LightSpecOptions", "LightSpecPlanner", "PLANNER_KINDS", "PlannerSpec", "SERVING_REUSE",
    "StaticPlanner", "StepObservation", "StepPlan", "draft_cost_ms", "geometric_buckets",
    "make_planner",
]
