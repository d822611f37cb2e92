"""Serving fixed plans (policy_ab.py's `replay_plans`): one untimed pass of the live planner
is recorded, then the engine plans with the recording - with the planner idle, or still
planning and learning beside it (`busy`) - so that two variants can run the very same steps and
differ in the planner's host work alone."""

from __future__ import annotations

import numpy as np


class ReplayedPlans:
    """Stands in for a planner: hands back the plans one pass of the live planner made, in
    order, and learns nothing - or, given the live planner (`busy`), has it plan and learn as
    before and throws its plans away. `rewind()` before each pass; `mismatches` counts the
    plans served to a batch other than the one they were made for (requests, allowances)."""

    def __init__(self, plans: list, busy=None) -> None:
        self.plans = plans  # (StepPlan, num_requests, remaining) per plan() call
        self.busy = busy
        self.at = self.mismatches = 0

    def rewind(self) -> None:
        self.at = 0

    def plan(self, *, num_requests, remaining=None, **kwargs):
        if self.busy is not None:
            self.busy.plan(num_requests=num_requests, remaining=remaining, **kwargs)
        if self.at == len(self.plans):
            raise RuntimeError("the replayed pass ran out of plans: the batches differ")
        plan, n, rem = self.plans[self.at]
        self.at += 1
        if n != num_requests or not np.array_equal(rem, remaining):
            self.mismatches += 1
        return plan

    def __getattr__(self, name):
        """The busy planner's (its observe() calls, its tables); without one, observe(),
        observe_host() and observe_period() do nothing."""
        if name != "busy" and self.busy is not None:
            return getattr(self.busy, name)
        if not name.startswith("observe"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


def replay_plans(engine, prompts, params, *, busy: bool = False,
                 plans: list | None = None) -> ReplayedPlans:
    """One untimed pass with the engine's live planner, its plans recorded; the engine then
    plans with ReplayedPlans (unless `busy`, its feedback learns nothing and writes no cost
    tables). Given `plans` (another engine's recorded pass: ReplayedPlans.plans), it serves
    those instead, with no pass of its own: engines that replay one list run the same steps,
    whatever their planners would have decided."""
    live = engine.planner
    if plans is not None:
        return _serve(engine, ReplayedPlans(plans, busy=live if busy else None), busy)
    plans = []

    def recording(**kwargs):
        plan = live_plan(**kwargs)
        remaining = kwargs.get("remaining")
        plans.append((plan, kwargs["num_requests"],
                      None if remaining is None else np.array(remaining)))
        return plan

    live_plan, live.plan = live.plan, recording
    try:
        engine.generate(prompts, params)
    finally:
        del live.plan  # the method again
    return _serve(engine, ReplayedPlans(plans, busy=live if busy else None), busy)


def _serve(engine, script: ReplayedPlans, busy: bool) -> ReplayedPlans:
    """The engine plans with `script` from now on."""
    engine.planner = script
    feedback = engine.planning.feedback
    if feedback is not None:
        feedback.planner = script
        feedback.refresh_costs = feedback.refresh_costs and busy
    return script
