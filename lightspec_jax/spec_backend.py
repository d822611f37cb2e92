"""Host side of speculative serving: plan the budget, build inputs, dispatch, read a step late.

An engine step with pending prompt chunks first dispatches a prefill step; every request whose
prompt is done then takes part in one speculative step whose shape (B verify rows, d next draft
depth) the planner picks from statistics up to the previous step. Nothing waits for the device
while dispatching: results of step i are read after step i+1 is in flight (the engine decides),
so planning, input building, streaming and statistics overlap with device work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np

from lightspec_jax.planner import CostTable, PlannerSpec, StepObservation, StepPlan, make_planner

from .config import EngineConfig, Policy
from .metrics import EngineStats, SpecCounters, StepRecord
from .profiling import profile_costs
from .request import Request
from .runner import build_step_inputs, set_sampling
from .scheduler import ScheduledStep
from .spec_runner import PrefillExtras, SpecResult, SpecRunner


def default_verify_buckets(max_rows: int) -> tuple[int, ...]:
    """Powers of two and their midpoints (1, 2, 3, 4, 6, 8, 12, ...) up to max_rows, inclusive."""
    out, b = {max_rows}, 1
    while b < max_rows:
        out.update(x for x in (b, b + b // 2) if x < max_rows)
        b *= 2
    return tuple(sorted(out))


@dataclasses.dataclass
class InFlight:
    """A dispatched step whose results have not been read yet."""

    prefill_requests: list[Request]  # requests whose first token the prefill step samples
    prefill_tokens: object | None  # device [N]
    decodes: tuple[Request, ...]
    plan: StepPlan | None
    result: SpecResult | None
    proposal_lens: dict  # request -> drafts its proposal offered at this step
    dispatched_at: float
    context_len: int
    # The device was still running earlier work (the previous step's drafting) when this
    # step's speculative work was enqueued: no idle gap before it.
    busy_at_enqueue: bool = False


def device_interval_ms(*, previous_ready: float | None, previous_waited: bool,
                       busy_at_enqueue: bool, waited: bool, ready: float,
                       has_prefill: bool) -> float | None:
    """Device time of one speculative step from host timestamps, or None when it is unknown.

    The host reads a step's results when its verify is done (`ready`), while the draft run
    dispatched with it goes on. Between two reads the device ran the previous step's draft run
    and this step's verify - one step's work - but only if it never idled in between, which the
    host can tell without syncing: it waited for both reads (the device was busy at each ready
    time, so each marks a verify's end) and, when it enqueued this step, the previous draft run
    was not finished (no gap). A host-bound loop (the device done before the host asks) gives
    no sample: its intervals time host work, which says nothing about a bucket's cost. A step
    that also prefills has that prefill in the interval and gives none either.
    """
    if previous_ready is None or has_prefill:
        return None
    if not (previous_waited and busy_at_enqueue and waited):
        return None
    return 1e3 * (ready - previous_ready)


class SyntheticAcceptance:
    """Per-request acceptance drawn from a workload profile (planner/profiles.py): a request
    quality fixed at its first step and a drifting difficulty, as in the simulator."""

    def __init__(self, model, *, max_depth: int, seed: int):
        self.model = model
        self.max_depth = max_depth
        self.rng = np.random.default_rng(seed)
        self.state: dict[Request, tuple[float, float]] = {}  # request -> (quality, drift)

    def draw(self, decodes, inputs) -> None:
        new = [r for r in decodes if r not in self.state]
        if new:
            quality = self.rng.normal(self.model.mu, self.model.profile.request_sigma, len(new))
            drift = self.model.initial_drift(self.rng, len(new))
            self.state.update({r: (q, z) for r, q, z in zip(new, quality, drift)})
        quality = np.array([self.state[r][0] for r in decodes])
        drift = np.array([self.state[r][1] for r in decodes])
        drift, accepted, conf = self.model.step(self.rng, quality, drift, self.max_depth)
        for i, request in enumerate(decodes):
            self.state[request] = (quality[i], drift[i])
            inputs.synthetic_accept[request.slot] = accepted[i]
            inputs.synthetic_conf[request.slot] = conf[i]

    def forget(self, request: Request) -> None:
        self.state.pop(request, None)


class SpecBackend:
    def __init__(self, target, drafter, *, config: EngineConfig, cache_len: int,
                 prefill_buckets: tuple[int, ...]):
        spec = config.speculative
        self.config = config
        self.overlap = config.overlap
        self.policy = spec.policy
        self.max_depth = k = spec.num_speculative_tokens
        self.num_slots = config.max_num_seqs
        max_rows = self.num_slots * (k + 1)
        self.verify_buckets = config.verify_buckets or default_verify_buckets(max_rows)
        if self.verify_buckets[-1] < max_rows:
            raise ValueError(f"verify_buckets must reach max_num_seqs * (K + 1) = {max_rows}, "
                             f"got {self.verify_buckets}")
        depths = tuple(range(1, k + 1)) if self.policy is Policy.DYNAMIC else (k,)
        self.synthetic = None
        if config.synthetic_acceptance:
            from lightspec_jax.planner.profiles import AcceptanceModel
            self.synthetic = SyntheticAcceptance(AcceptanceModel.calibrated(
                config.synthetic_acceptance), max_depth=k, seed=config.seed)
        self.runner = SpecRunner(target, drafter, num_slots=self.num_slots, cache_len=cache_len,
                                 max_depth=k, prefill_buckets=prefill_buckets,
                                 verify_buckets=self.verify_buckets, depths=depths,
                                 show_progress=config.show_progress,
                                 synthetic=self.synthetic is not None)
        self.target_costs, self.draft_costs, self.depth_costs, self.profile = self._costs()
        planner_spec = PlannerSpec(verify_buckets=self.verify_buckets, draft_depths=depths,
                                   max_depth=k, drafter_kind=drafter.kind)
        options = {"depth": k} if self.policy is Policy.STATIC else {}
        self.planner = make_planner(self.policy.value, planner_spec,
                                    target_costs=self.target_costs,
                                    draft_costs=self.draft_costs,
                                    depth_costs=self.depth_costs, **options)
        self.stats = EngineStats(synthetic_acceptance=config.synthetic_acceptance)
        # The last read's time, whether the host waited for it, and the speculative plan it
        # read (None for a prefill-only step): device_interval_ms() for the online refresh.
        self._last_ready: float | None = None
        self._last_waited = False
        self._last_plan: StepPlan | None = None
        self._last_conf: np.ndarray | None = None  # [N, K] confidences, a step late (dspark)

    @property
    def compile_seconds(self) -> float:
        return self.runner.compile_seconds

    def _costs(self):
        path = self.config.cost_table_path
        if self.policy is Policy.STATIC and not path:
            return CostTable(), CostTable(), CostTable(), None  # full width needs no prices
        if path and os.path.isfile(path):
            with open(path) as f:
                data = json.load(f)
            # Files written before the depth table existed price drafting per forward.
            depth = CostTable.from_json(data["depth"]) if "depth" in data else CostTable()
            return (CostTable.from_json(data["target"]), CostTable.from_json(data["draft"]),
                    depth, None)
        profile = profile_costs(self.runner, show_progress=self.config.show_progress)
        if path:
            with open(path, "w") as f:
                json.dump({"target": profile.target.to_json(), "draft": profile.draft.to_json(),
                           "depth": profile.depth.to_json(), "profile": profile.summary()},
                          f, indent=1)
        return profile.target, profile.draft, profile.depth, profile

    # --- dispatch (no device reads) ---------------------------------------------------------

    def dispatch(self, batch: ScheduledStep) -> InFlight:
        start = time.perf_counter()
        # The state the previous draft run writes: not ready yet means the device is busy.
        busy = not self.runner.state.proposal_len.is_ready()
        prefill_requests, prefill_tokens = [], None
        if batch.prefills:
            prefill_requests, prefill_tokens = self._dispatch_prefill(batch)
        plan = result = None
        proposal_lens = {}
        context = sum(r.total_len for r in batch.decodes)
        if batch.decodes:
            plan, result, proposal_lens = self._dispatch_spec(batch.decodes, context)
        return InFlight(prefill_requests, prefill_tokens, batch.decodes, plan, result,
                        proposal_lens, start, context, busy_at_enqueue=busy)

    def _dispatch_prefill(self, batch: ScheduledStep):
        prefill_only = ScheduledStep(decodes=(), prefills=batch.prefills)
        rows = self.runner.prefill_registry.pick(prefill_only.num_rows)
        inputs = build_step_inputs(prefill_only, rows, self.num_slots)
        extras = self.runner.empty_extras(rows)
        row, completing = 0, []
        for chunk in batch.prefills:
            request, end = chunk.request, chunk.start + chunk.length
            # x_{p+1} for each prompt row: the next prompt token, or this step's sample.
            nxt = request.prompt_token_ids[chunk.start + 1:end + 1]
            extras.row_next_token[row:row + len(nxt)] = nxt
            if chunk.completes_prompt:
                extras.row_next_from_sample[row + chunk.length - 1] = True
                extras.completes[request.slot] = True
                extras.prompt_len[request.slot] = request.prompt_len
                request.proposal_len = 0
                request.spec = request.spec or SpecCounters()
                completing.append(request)
            row += chunk.length
        return completing, self.runner.run_prefill(inputs, extras)

    def _dispatch_spec(self, decodes, context):
        inputs = self.runner.empty_spec_inputs()
        for request in decodes:
            slot, p = request.slot, request.params
            inputs.active[slot] = True
            set_sampling(inputs, request)
            stops = sorted(request.stop_ids)
            inputs.stop_ids[slot, :len(stops)] = stops
            # Host counts lag one step under overlap, so this may overestimate; the device cut
            # is an optimisation and the host cuts exactly when it reads the tokens.
            inputs.remaining[slot] = min(p.max_tokens - len(request.output_token_ids),
                                         self.config.max_model_len - request.total_len)
        if self.synthetic is not None:
            self.synthetic.draw(decodes, inputs)
        with_proposal = sum(r.proposal_len > 0 for r in decodes)
        confidences = None
        if self.policy is Policy.DSPARK and self._last_conf is not None:
            confidences = self._last_conf[[r.slot for r in decodes]]
        plan = self.planner.plan(num_requests=len(decodes), num_with_proposal=with_proposal,
                                 confidences=confidences, context_len=context)
        result = self.runner.run_spec(inputs, rows=plan.verify_rows, depth=plan.draft_depth)
        proposal_lens = {r: r.proposal_len for r in decodes}
        for request in decodes:
            request.proposal_len = plan.draft_depth
        return plan, result, proposal_lens

    # --- collect (reads the device) ---------------------------------------------------------

    def collect(self, flight: InFlight) -> list[tuple[Request, list[int]]]:
        last = flight.result.num_emitted if flight.result is not None else flight.prefill_tokens
        waited = last is not None and not last.is_ready()
        new_tokens = []
        if flight.prefill_requests:
            tokens = np.asarray(flight.prefill_tokens)
            new_tokens += [(r, [int(tokens[r.slot])]) for r in flight.prefill_requests]
        if flight.result is not None:
            new_tokens += self._collect_spec(flight, waited)
        else:
            self._last_ready, self._last_waited, self._last_plan = (
                time.perf_counter(), waited, None)
        return new_tokens

    def _collect_spec(self, flight: InFlight, waited: bool):
        result, plan, decodes = flight.result, flight.plan, flight.decodes
        out_tokens, emitted, accepted, verified, stepped = (
            np.asarray(x) for x in (result.out_tokens, result.num_emitted, result.accepted,
                                    result.verified, result.stepped))
        ready = time.perf_counter()
        step_ms = None
        if self.config.refresh_costs and self._last_plan is not None:
            step_ms = device_interval_ms(
                previous_ready=self._last_ready, previous_waited=self._last_waited,
                busy_at_enqueue=flight.busy_at_enqueue, waited=waited, ready=ready,
                has_prefill=flight.prefill_tokens is not None)
        draft_plan = self._last_plan
        self._last_ready, self._last_waited, self._last_plan = ready, waited, plan
        if self.policy is Policy.DSPARK:
            self._last_conf = np.asarray(result.confidence)
        slots = np.array([r.slot for r in decodes])
        if not stepped[slots].all():
            missing = [r.request_id for r in decodes if not stepped[r.slot]]
            raise RuntimeError(f"requests {missing} got no verify row in a {plan.verify_rows}-"
                               f"row bucket for {len(decodes)} requests")
        new_tokens = []
        for request in decodes:
            if self.synthetic is not None and request.finished:
                self.synthetic.forget(request)
            slot, offered = request.slot, flight.proposal_lens[request]
            counts = dict(drafted=offered, verified=int(verified[slot]),
                          accepted=int(accepted[slot]))
            request.spec.add(**counts)
            self.stats.totals.add(**counts)
            new_tokens.append((request, out_tokens[slot, :emitted[slot]].tolist()))
        self.planner.observe(StepObservation(
            plan=plan, accept_lens=accepted[slots] + 1, context_len=flight.context_len,
            step_ms=step_ms, draft_plan=draft_plan if step_ms is not None else None))
        self.stats.steps.append(StepRecord(
            num_requests=len(decodes), verify_rows=plan.verify_rows,
            used_rows=int((verified[slots] + 1).sum()), draft_depth=plan.draft_depth,
            accepted=int(accepted[slots].sum()), emitted=int(emitted[slots].sum()),
            seconds=ready - flight.dispatched_at))
        return new_tokens
