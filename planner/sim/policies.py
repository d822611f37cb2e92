"""The simulator's policies: what each simulated policy runs (planner kind, maximum depth, planner
options, the floor, the draft loop's stop), and the sets the default and --all runs use.

Keys are the simulator's own (static-3, dynamic-no-floor, ...); `lightspec-bench simulate` spells
the plain ones as `serve` does (lightspec_jax/bench/simulate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import SERVING_REUSE


@dataclass(frozen=True, kw_only=True)
class Policy:
    label: str
    kind: str  # "static" | "dynamic" | "dspark" | "oracle" | "informed"
    max_depth: int
    options: tuple = ()  # (name, value) pairs passed to make_planner
    floor: bool | None = None  # depth 0 offered; None: as the engine (dynamic) and the oracle
    # The draft loop stops once no request's prefix survival (planner/fill.py's score) at the
    # position just drafted reaches this, short of the planned depth (0: it never stops early)
    draft_stop: float = 0.0

    @property
    def offers_floor(self) -> bool:
        return (self.kind in ("dynamic", "oracle", "informed") if self.floor is None
                else self.floor)

    @property
    def is_ablation(self) -> bool:
        """Whether the policy sets options or a floor of its own, beyond what a serving
        engine runs (the dynamic planner's decision reuse, SERVING_REUSE)."""
        engine = SERVING_REUSE if self.kind == "dynamic" else {}
        return (dict(self.options) != dict(engine) or self.floor is not None
                or self.draft_stop > 0.0)


_REUSE = tuple(SERVING_REUSE.items())
POLICIES: dict[str, Policy] = {
    "static-3": Policy(label="static K=3", kind="static", max_depth=3),
    "static-11": Policy(label="static K=11", kind="static", max_depth=11),
    "static-7": Policy(label="static K=7", kind="static", max_depth=7),  # calibration check
    # the engine's dynamic planner, reusing decisions as the engine does (its ablations too,
    # but LightLLM's and the one that decides every step)
    "dynamic": Policy(label="LightSpec dynamic K<=11", kind="dynamic", max_depth=11,
                      options=_REUSE),
    "dspark": Policy(label="DSpark-style K=7", kind="dspark", max_depth=7),
    "oracle": Policy(label="oracle K<=11", kind="oracle", max_depth=11),
    # the oracle without hindsight: each request's acceptance probabilities this step, not the
    # draws (oracle.InformedOracle); and knowing less of the request's state: its quality and
    # last step's drift (this step's drift a draw away), or its quality alone
    "informed": Policy(label="informed oracle K<=11", kind="informed", max_depth=11),
    "informed-last": Policy(label="informed oracle, the state a step late", kind="informed",
                            max_depth=11, options=(("knows", "last"),)),
    "informed-request": Policy(label="informed oracle, request quality only", kind="informed",
                               max_depth=11, options=(("knows", "request"),)),
    "informed-filter": Policy(label="informed oracle, drift learned from outcomes",
                              kind="informed", max_depth=11, options=(("knows", "filter"),)),
    # ablations of the dynamic planner
    "dynamic-lightllm": Policy(
        label="dynamic as LightLLM's final planner", kind="dynamic", max_depth=11,
        options=(("refresh_costs", False), ("explore_fraction", 0.0), ("stat_half_life", None),
                 ("sample_floor", 1), ("full_width_from_survival", False),
                 ("level_variance", 0.0), ("calibrate", False)),
        floor=False),  # LightLLM's eagle3 mode allows depths 1..K only (§5)
    "dynamic-no-floor": Policy(label="dynamic, no depth-0 floor", kind="dynamic",
                               max_depth=11, options=_REUSE, floor=False),
    "dynamic-no-refresh": Policy(label="dynamic, start-up costs only", kind="dynamic",
                                 max_depth=11, options=_REUSE + (("refresh_costs", False),)),
    "dynamic-cell-refresh": Policy(label="dynamic, cost tables refreshed cell by cell",
                                   kind="dynamic", max_depth=11,
                                   options=_REUSE + (("refresh_cells", True),)),
    "dynamic-no-explore": Policy(label="dynamic, no probes/aging", kind="dynamic", max_depth=11,
                                 options=_REUSE + (("explore_fraction", 0.0),
                                                   ("stat_half_life", None))),
    "dynamic-no-level": Policy(label="dynamic, pooled level only", kind="dynamic",
                               max_depth=11, options=_REUSE + (("level_variance", 0.0),)),
    "dynamic-no-calibration": Policy(label="dynamic, modelled step costs only", kind="dynamic",
                                     max_depth=11, options=_REUSE + (("calibrate", False),)),
    "dynamic-interp": Policy(label="dynamic, interpolation estimator", kind="dynamic",
                             max_depth=11, options=_REUSE + (("estimator", "interpolate"),)),
    "dynamic-every-step": Policy(label="dynamic, decides every step", kind="dynamic",
                                 max_depth=11, options=(("replan_every", 1),)),
    "dspark-11": Policy(label="DSpark-style K=11", kind="dspark", max_depth=11),
    # what a device-side early exit from the draft loop would add. Not in the engine: on a GPU
    # the loop's trip count is read back to the host every iteration (engine/step.py), and on
    # the CPU, tried on the shipped pair, it lost to the planned depth (BENCHMARKS.md,
    # "Forty-first session: stopping the draft loop early")
    "dynamic-draft-stop": Policy(label="dynamic, draft loop stops below 0.4", kind="dynamic",
                                 max_depth=11, options=_REUSE, draft_stop=0.4),
}
MAIN_POLICIES = ("static-3", "static-11", "dynamic", "dspark", "oracle")
ABLATION_POLICIES = ("dynamic", "dynamic-every-step", "dynamic-lightllm", "dynamic-no-floor",
                     "dynamic-no-refresh", "dynamic-no-explore", "dynamic-no-level",
                     "dynamic-interp", "dspark-11")
CONCURRENCIES = (1, 4, 16, 64, 256)
