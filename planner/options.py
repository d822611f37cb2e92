"""The dynamic planner's options (LightSpecPlanner, lightspec.py): the statistics' decays and
estimator, exploration, decision reuse, the floor's margin, the batch's acceptance level and
the calibrations. Every field is also a keyword of make_planner("dynamic", ...)."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from .stats import ESTIMATORS


# The decision reuse a serving engine's dynamic planner runs with (engine/planning.py), and
# so the simulator's (sim/simulate.py): a decision serves up to 4 plan() calls of one shape,
# up to 16 while fresh decisions repeat the floor. Deciding is most of plan()'s host time,
# which at high concurrency is step time. The options' own default (1) decides every step.
SERVING_REUSE = MappingProxyType({"replan_every": 4, "replan_limit": 16})


@dataclass(frozen=True, kw_only=True)
class LightSpecOptions:
    estimator: str = "survival"  # or "interpolate" (§10 ablation)
    progress_decay: float = 0.9  # EMA weight of the old value (LightLLM: 0.9)
    survival_decay: float = 0.9
    stat_half_life: float | None = 512.0  # steps; None keeps EMAs forever (LightLLM)
    sample_floor: int = 16  # requests per full-weight EMA update; 1 is LightLLM's rule
    full_width_from_survival: bool = True  # False: full-width keys use their EMA (LightLLM)
    explore_fraction: float = 0.02  # share of step time probes may cost; 0 disables probes
    min_probe_interval: int = 16  # steps between probes, at least
    refresh_costs: bool = True  # EMA-refresh cost tables from measured times
    # The refresh moves each context column of a table as a whole, keeping the shape the
    # start-up sweep measured (CostTable.update_level); True: each cell follows its own
    # samples (CostTable.update), the refresh before the forty-third session.
    refresh_cells: bool = False
    reprice_every: int = 8  # plan() calls that may reuse one pricing (BasePlanner)
    floor_margin: float = 0.02  # the floor must beat the best depth >= 1 by this share
    # plan() calls that may reuse one decision while the step's shape stays nearly put (the
    # depth verified, N within 1/32, its verify bucket: LightSpecPlanner._reuse); 1 decides
    # afresh every step.
    # The statistics move a few percent per step at most, and deciding is most of plan()'s
    # host time, which is step time (the engine reuses for 4 steps).
    replan_every: int = 1
    # While fresh decisions keep choosing the floor (depth 0), the reuse horizon doubles, up
    # to replan_limit plan() calls (None: replan_every, no growth); any other depth sets it
    # back to replan_every. A batch that sits at the floor re-decided depth 0 every 4 steps,
    # a third of the dynamic floor's host time over plain decoding at c = 256 under churn
    # (the engine grows it to 16). Drafting decisions keep the short window: a probe or a
    # rival depth is tried only at a fresh decision, and at c = 32 (math) a grown window
    # at every depth held the planner at depth 1 through one of two runs.
    replan_limit: int | None = None
    # Reuse saves host time, which costs the step only where the loop does not hide it. With
    # an overlapped loop (the planner's `overlap`), a decision whose step prices the host at
    # most this share of the step's time, hidden under the device (calibration.HostOverlap),
    # is not reused: the next plan() decides afresh, from the latest statistics. In the
    # simulator (H200 / Qwen3-14B) reusing there cost 0.2-1.1% at c <= 16. 0: reuse regardless.
    hidden_host_share: float = 0.5
    # The batch's acceptance level (level.py): a filtered logit offset of the pooled survival,
    # mean-reverting with `level_rho` per learned step, whose spread across single requests is
    # level_variance (logit^2; an N-request batch's mean: level_variance / N). 0 turns it off.
    level_variance: float = 0.5
    level_rho: float = 0.95
    # Price steps by how far the loop's measured step times sit from the model's, per bucket
    # and depth and per regime (drafting or the floor; calibration.py), and now and then
    # visit a rival depth priced within rival_window of the best so that it gets measured.
    calibrate: bool = True
    rival_window: float = 0.2
    # A visit to the floor lasts this many steps: the first verifies the proposal in hand and
    # drafts nothing, the others are floor steps, whose periods the calibration learns from.
    # A one-step visit is followed by a step that leaves the floor, which for a drafter that
    # catches up carries the commit and the catch-up, and no floor step at all.
    floor_visit: int = 4
    # Choose the next depth with each depth's predicted drafts scaled by what the steps that
    # verified that depth really accepted against their prediction (calibration.TokenCalibration).
    calibrate_tokens: bool = True
    # The survival also learns from trimmed steps, at the depths every request had verified
    # (AcceptanceStats.record), and each depth's first samples meet a prior curve
    # survival_prior_accept^j of survival_prior_weight full-weight steps: one unlucky step
    # of a lone request (c = 1) no longer prices every deeper row at 0, a price that trims
    # them, and a trimmed row is never measured to be corrected.
    survival_from_trimmed: bool = True
    survival_prior_weight: float = 0.0625  # one request of sample_floor 16
    survival_prior_accept: float = 0.9
    # Price an autoregressive drafter's stage on the line through its measured depths
    # (objective._depth_line), not depth by depth.
    linear_depth: bool = True

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if not 0.0 <= self.explore_fraction < 1.0:
            raise ValueError(f"explore_fraction must be in [0, 1), got {self.explore_fraction}")
        if self.min_probe_interval < 1:
            raise ValueError(f"min_probe_interval must be >= 1, got {self.min_probe_interval}")
        if self.floor_visit < 1:
            raise ValueError(f"floor_visit must be >= 1 step, got {self.floor_visit}")
        if self.replan_every < 1:
            raise ValueError(f"replan_every must be >= 1, got {self.replan_every}")
        if not 0.0 <= self.hidden_host_share <= 1.0:
            raise ValueError(f"hidden_host_share must be in [0, 1], got {self.hidden_host_share}")
        if self.replan_limit is not None and self.replan_limit < self.replan_every:
            raise ValueError(f"replan_limit must be >= replan_every ({self.replan_every}), "
                             f"got {self.replan_limit}")
