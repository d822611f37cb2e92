"""The engine's side of planning: which planner a policy gets, with what prices, and the plan
of each decode step (host only).

    none     no planner: one verify row per decoding request, nothing drafted
    static   full width at depth K; prices only to fill a given cost-table path
    dynamic  the LightSpec planner over measured prices (the start-up sweep or the stored
             table: costs.py), refreshed from what each step cost (PlannerFeedback, below),
             with the no-speculation floor (depth 0) among its choices
    dspark   confidence-gated drafting, reading the verified proposal's confidences

Over several processes a timed plan is process 0's, broadcast to the others (multihost.py).
With data parallelism a plan's verify bucket gives the busiest replica a row per decoding
slot (scheduler.rows_needed).

What the planner learns from each read-back (PlannerFeedback): a decode step's read-back feeds
it four things, each at the moment it is known:

* the acceptance of the proposal it verified, per request (`learn`: StepObservation), with
  the device interval between this read-back and the previous one when the device never
  idled between them - the previous step's drafting and this verify, which the online cost
  refresh splits over its tables;
* the host ms the step() call spent (`record`: observe_host), less what dispatching its
  prompt chunks took;
* the loop's period between two read-backs (`record`: observe_period), what the step really
  cost, for the whole-step calibration;
* for the DSpark-style policy, the verified proposal's confidences, which the next plan reads.

Steps that compiled a variant on first use or read before dispatching are not samples of a
decode step's costs, nor are the device interval and period of a step that ran a prompt chunk
(see `learn`, `record`). The refreshed cost tables go back to the engine's persistent store now
and then, and when generate() ends (`save`).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from lightspec_jax.planner import (SERVING_REUSE, PlannerSpec, StepObservation, StepPlan,
                                   make_planner)

from ..config import EngineConfig, Policy
from ..drafters import Drafter
from .costs import CostStore, device_interval_ms
from .multihost import Lockstep
from .runner import ModelRunner
from .scheduler import Scheduler, rows_needed

# A floor step (it verifies no proposal and drafts none) teaches the planner only what steps
# cost; one floor step in FLOOR_TIMED is a timing sample (device interval, host ms, period)
# and the others skip the planner's bookkeeping: at math, n-gram, c = 1 - nine steps in ten
# at the floor - feeding every one cost 0.14 ms of a 2.1 ms step. The first FLOOR_TIMED steps
# of each run at the floor are all samples: the planner's visits to the floor are short runs,
# and with one step in four timed the floor was hardly measured (ShareGPT, draft LM, c = 16:
# one floor period of 91, from a step that left the floor, at 1.2x its price; 16 of them,
# at 0.93x, with every visit's floor steps timed).
FLOOR_TIMED = 4


def hides_host_time(config: EngineConfig) -> bool:
    """Whether the loop hides host time under device time (the planner then prices a step
    at max(device, host), else at their sum). Overlap hides it on an accelerator; on the CPU
    backend the "device" computes on the same cores as the host loop, so the two add up
    (host_overhead.py: with a max() model at c=64 the planner took host-bound rows for free
    and ran 2.65x a plain step instead of 1.45x)."""
    return config.overlap and jax.default_backend() != "cpu"


class StepPlanning:
    """The planner of one engine (None for plain decoding), its prices (`cost_profile`), what
    it learns from read-backs (`feedback`) and, over several processes, the shared plans."""

    def __init__(self, config: EngineConfig, model, runner: ModelRunner,
                 drafter: Drafter | None, *, depths: tuple[int, ...],
                 lockstep: Lockstep | None) -> None:
        """depths: the draft depths the policy may plan."""
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
        # A dynamic engine reuses its decisions (SERVING_REUSE: planner/options.py), and
        # learns from measured times only where the engine feeds them.
        options = ({"depth": k} if spec.policy is Policy.STATIC else
                   {**SERVING_REUSE, "refresh_costs": config.refresh_costs}
                   if spec.policy is Policy.DYNAMIC else {})
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
            overlap=hides_host_time(config), **tables, **options)
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


class PlannerFeedback:
    """The planner's side of reading a step back; one per engine with a planner."""

    def __init__(self, planner, *, refresh_costs: bool, keep_confidences: bool,
                 short_proposals: bool, cost_store: CostStore | None, cost_profile) -> None:
        self.planner = planner
        self.refresh_costs = refresh_costs
        self.keep_confidences = keep_confidences  # the dspark policy reads them next step
        self.short_proposals = short_proposals  # the drafter may propose fewer than d tokens
        # Where save() writes the refreshed tables (None: nowhere); a benchmark may point it
        # elsewhere, so that a tuned planner's refresh stays out of the shared cache.
        self.cost_store, self._profile = cost_store, cost_profile
        # The previous read's time and whether it waited (device intervals).
        self._last_ready: float | None = None
        self._last_waited = False
        self._last_plan: StepPlan | None = None  # the previous decode step's plan
        # (when, step index) of the last decode-only read-back (whole-step periods)
        self._last_read: tuple[float, int] | None = None
        self.floor_timed = FLOOR_TIMED
        self._floor_run = 0  # floor steps read back since the last step that was not one
        self._timed = True  # whether the step read back last is a timing sample
        self.last_conf: np.ndarray | None = None  # [N, K], a step late (dspark)

    def learn(self, flight, readback: np.ndarray, *, columns, live: np.ndarray,
              remaining: np.ndarray, classes: np.ndarray, waited: bool, ready: float) -> float:
        """A decode step read back: its acceptance and device interval into the planner.
        flight: the engine's record of the dispatched step; readback [N, K+1+5]; live [N] the
        slots whose tokens were applied; remaining, classes [N] the scheduler's per slot.
        Returns the ms the planner spent observing (plan time of the step)."""
        c, plan = columns, flight.plan
        step_ms = None
        if plan.at_floor:
            run = self._floor_run
            self._timed = run < self.floor_timed or run % self.floor_timed == 0
            self._floor_run += 1
        else:
            # A step that leaves the floor (it verifies no proposal but drafts) runs work its
            # plan does not price - for a drafter that catches up, the commit forward and the
            # catch-up over the floor steps' positions - so its times would price the floor's
            # cells high: it is no sample.
            self._timed = plan.verified_depth > 0 or plan.draft_depth == 0
            self._floor_run = 0
        if self._timed and self.refresh_costs and not flight.prefill_rows:
            # A step with prompt chunks times them too: not a decode bucket's cost.
            step_ms = device_interval_ms(
                previous_ready=self._last_ready, previous_waited=self._last_waited,
                busy_at_enqueue=flight.busy_at_enqueue, waited=waited, ready=ready)
        self._last_ready, self._last_waited = ready, waited
        # Between two read-backs the device ran the previous step's drafting and this
        # step's verify: the interval prices those two.
        drafted, self._last_plan = self._last_plan, plan
        if self.keep_confidences:
            self.last_conf = np.asarray(flight.confidence)
        if plan.verified_depth == 0 and step_ms is None:
            # A step that verified no proposal and timed nothing teaches the planner nothing
            # (the context comes with each plan): at the floor, c = 256, reading it back for
            # the planner cost 0.17 ms a step.
            return 0.0
        accepted = readback[live, c.accepted]
        if not len(accepted):
            return 0.0
        started = time.perf_counter()
        seen = plan
        if len(accepted) != plan.num_requests:
            # A request ended on the device before this step (the host had not read it
            # yet): inactive, it took no row, so the others are this step.
            seen = dataclasses.replace(plan, num_requests=len(accepted))
        held, uncensored = c.proposal_outcomes(
            readback[live], plan.verified_depth, given=flight.with_proposal[live],
            room=remaining[live] + readback[live, c.emitted] - 1,
            short_proposals=self.short_proposals)
        self.planner.observe(StepObservation(
            plan=seen, accept_lens=np.minimum(accepted, plan.verified_depth) + 1,
            verify_lens=readback[live, c.verified] + 1, had_proposal=held,
            uncensored=uncensored, sampling_classes=classes[live],
            context_len=flight.context_len, step_ms=step_ms,
            draft_plan=drafted if step_ms is not None else None))
        return 1e3 * (time.perf_counter() - started)

    def record(self, event, *, host_ms: float, prompt_ms: float | None, drafted: bool,
               sample: bool, decode_steps: int) -> None:
        """A step read back and recorded by a step() call that spent `host_ms` on the host,
        `prompt_ms` of it dispatching slot writes and prompt chunks (None: no chunk). When the
        call is a sample (it compiled nothing and overlapped: `sample`), its host time less the
        prompt work feeds the planner's host prices: in a serving batch at high concurrency
        nearly every step carries a chunk, and leaving those out left the planner no host
        prices at all (c = 256 under churn). The loop's period feeds the calibration only
        between steps without prompt work, which a period would hold: neither the step read
        back nor the call may have dispatched a chunk."""
        record = event.record
        learns = self.refresh_costs and record.num_requests and sample
        if learns and self._timed:
            self.planner.observe_host(num_requests=record.num_requests,
                                      host_ms=host_ms - (prompt_ms or 0.0), drafted=drafted)
        if learns and prompt_ms is None and not record.prefill_rows:
            self._observe_period(event, timed=self._timed)
        else:
            self._last_read = None
        if record.verify_rows and decode_steps % 1024 == 0:
            self.save()

    def _observe_period(self, event, *, timed: bool) -> None:
        """The wall time since the previous read-back, when both were decode-only steps: the
        drafting of the proposal this step verified, then its verify - what the step really
        cost the loop, for the planner's whole-step calibration (planner/calibration.py), when
        the step is a timing sample (`timed`)."""
        now, last = time.perf_counter(), self._last_read
        if timed and last is not None and last[1] == event.record.index - 1:
            self.planner.observe_period(plan=event.plan, period_ms=1e3 * (now - last[0]))
        self._last_read = (now, event.record.index)

    def save(self) -> None:
        """Keeps the stored tables current with the online refresh (an occasional write)."""
        if self.refresh_costs and self.cost_store:
            self.cost_store.save(dataclasses.replace(
                self._profile, target=self.planner.target_costs,
                draft=self.planner.draft_costs, depth=self.planner.depth_costs))
