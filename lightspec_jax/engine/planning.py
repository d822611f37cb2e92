"""The engine's side of planning: which planner a policy gets, with what prices, and the plan
of each decode step (host only).

    none     no planner: one verify row per decoding request, nothing drafted
    static   full width at depth K; prices only to fill a given cost-table path
    dynamic  the LightSpec planner over measured prices (the start-up sweep or the stored
             table: costs.py), refreshed from what each step cost (feedback.py), with the
             no-speculation floor (depth 0) among its choices
    dspark   confidence-gated drafting, reading the verified proposal's confidences

Over several processes a timed plan is process 0's, broadcast to the others (multihost.py).
With data parallelism a plan's verify bucket gives the busiest replica a row per decoding
slot (scheduler.rows_needed).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lightspec_jax.planner import PlannerSpec, StepPlan, make_planner

from ..config import EngineConfig, Policy
from ..drafters import Drafter
from .costs import CostStore
from .feedback import PlannerFeedback
from .multihost import Lockstep
from .runner import ModelRunner
from .scheduler import Scheduler, rows_needed


class StepPlanning:
    """The planner of one engine (None for plain decoding), its prices (`cost_profile`), what
    it learns from read-backs (`feedback`) and, over several processes, the shared plans."""

    def __init__(self, config: EngineConfig, model, runner: ModelRunner,
                 drafter: Drafter | None, *, depths: tuple[int, ...], overlap: bool,
                 lockstep: Lockstep | None) -> None:
        """depths: the draft depths the policy may plan; overlap: whether the loop hides host
        time under device time (engine.hides_host_time)."""
        self.runner = runner
        self.planner = self.cost_profile = self.feedback = self.shared = None
        spec = config.speculative
        if spec.policy is Policy.NONE:
            return
        k = spec.num_speculative_tokens
        tables, store = {}, None
        # Full width needs no prices: static decoding sweeps only to fill a given path.
        if spec.policy is not Policy.STATIC or config.cost_table_path:
            store = CostStore.for_engine(config, runner, model, depths=depths,
                                         policy=spec.policy.value)
            self.cost_profile = p = store.load_or_sweep(
                runner, depths=depths, show_progress=config.show_progress, lockstep=lockstep)
            tables = dict(target_costs=p.target, draft_costs=p.draft, depth_costs=p.depth)
        # A dynamic engine reuses a decision for up to 4 steps of one shape: deciding is most
        # of plan()'s host time, which at high concurrency is step time.
        options = ({"depth": k} if spec.policy is Policy.STATIC else
                   {"replan_every": 4} if spec.policy is Policy.DYNAMIC else {})
        # The verify step keeps the drafter's cache current at every depth (a parallel
        # drafter's too: its commit writes the context; one that catches up does so before it
        # drafts again), so depth 0 (no draft step) is a choice: the no-speculation floor.
        parallel = drafter.kind == "parallel"
        self.planner = make_planner(
            spec.policy.value,
            PlannerSpec(verify_buckets=runner.decode_registry.sizes, draft_depths=depths,
                        max_depth=k, drafter_kind=drafter.kind,
                        block_size=drafter.block_size if parallel else None,  # one forward
                        block_lead=drafter.block_lead if parallel else None,  # past d
                        floor=spec.policy is Policy.DYNAMIC),
            overlap=overlap, **tables, **options)
        # Over several processes, a plan that follows measured times is process 0's; a static
        # plan follows the requests alone. Process 0 alone learns and writes.
        if lockstep is not None and spec.policy is not Policy.STATIC:
            self.shared = lockstep
        if lockstep is None or lockstep.leads:
            self.feedback = PlannerFeedback(
                self.planner, refresh_costs=config.refresh_costs,
                keep_confidences=spec.policy is Policy.DSPARK,
                short_proposals=drafter.short_proposals, cost_store=store,
                cost_profile=self.cost_profile)

    def plan(self, batch, scheduler: Scheduler, *, lag: int) -> StepPlan:
        """The plan of a step that decodes `batch.num_decoding` requests. lag: tokens the
        step in flight will emit per request that the scheduler's allowances do not show yet
        (1 while a decode step is in flight, else 0)."""
        plan = self._choose(batch, scheduler, lag)
        replicas = self.runner.replicas
        if replicas > 1:
            # Each data-parallel replica verifies B / D rows of its own slots: B must give the
            # busiest one a row per decoding slot (one device: B >= N already).
            need = rows_needed(scheduler.decoding, replicas)
            if plan.verify_rows < need:
                plan = dataclasses.replace(plan,
                                           verify_rows=self.runner.decode_registry.pick(need))
        return plan

    def _choose(self, batch, scheduler: Scheduler, lag: int) -> StepPlan:
        n = batch.num_decoding
        if self.planner is None:  # plain decoding: one row per decoding request
            rows = self.runner.decode_registry.pick(n)
            return StepPlan(num_requests=n, num_with_proposal=0, verified_depth=0, fill_rows=n,
                            verify_rows=rows, draft_depth=0, update_stats=False, reason="plain")
        shared = self.shared
        if shared is not None and not shared.leads:
            return shared.plan(None)  # process 0's
        decoding = scheduler.decoding
        conf = None if self.feedback is None else self.feedback.last_conf
        confidences = None if conf is None else conf[decoding]
        remaining = np.maximum(scheduler.remaining[decoding] - lag, 1)
        plan = self.planner.plan(num_requests=n, num_with_proposal=batch.num_with_proposal,
                                 confidences=confidences, context_len=batch.context_len,
                                 remaining=remaining,
                                 sampling_classes=scheduler.acceptance_class[decoding])
        return plan if shared is None else shared.plan(plan)
