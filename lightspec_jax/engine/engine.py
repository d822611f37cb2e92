"""The serving engine: the public API over one step loop.

    engine = Engine.from_pretrained(path, config=EngineConfig(max_num_seqs=16))
    outs = engine.generate(prompts, SamplingParams(max_tokens=64))

or, in a custom serving loop: add_request / step / abort / has_unfinished_requests.

One engine step reads as the algorithm: schedule (admit, prefill chunks: scheduler.py) ->
plan (the verify bucket B and next draft depth d: planning.py) -> run (dispatch slot writes,
prefill, the decode step and its drafting, nothing waits: runner.py) -> postprocess (read the
previous step back, one packed array; the scheduler applies it) -> observe (planner
statistics and cost refresh: planning.py; step records, observers).
Step i+1 is dispatched before step i is read (`overlap`), so host work hides behind the device.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from ..config import BATCH_INVARIANT_ROW_TILE, EngineConfig, Policy, SamplingParams
from ..drafters import Drafter
from ..metrics import EngineStats, StepRecord
from ..request import Request, RequestError, RequestOutput
from ..tokenizer import Tokenizer
from .flight import InFlight, StepEvent
from .intake import make_request
from .buckets import CompileWatch, lazy_compile_events
from .multihost import Lockstep
from .planning import StepPlanning
from .runner import ModelRunner
from .scheduler import Scheduler
from .shapes import announce, engine_shapes
from .verifier import verifier_for


class Engine:
    def __init__(self, model, *, config: EngineConfig = EngineConfig(),
                 tokenizer: Tokenizer | None = None, eos_token_ids: Sequence[int] = (),
                 drafter: Drafter | None = None, verifier=None):
        """model: a Qwen3 target; drafter: an Eagle3, DFlash, DSpark, draft-LM or n-gram
        drafter (speculative policies; with SpeculativeConfig(method="ngram") the engine makes
        its own; a DFlash drafter drafts at most block_size - 1 tokens from a block cut to
        the depth, a DSpark one block_size, always from its whole block); verifier: how drafts
        are accepted (default from `config.speculative.verification`: exact match, lossless
        token for token, or rejection sampling; the benchmarks inject `SyntheticAcceptance`,
        also chosen by `config.synthetic_acceptance`)."""
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_size = model.config.vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        spec = config.speculative
        self.policy = spec.policy
        shapes = engine_shapes(config, model, drafter)
        self.drafter = drafter = shapes.drafter
        n, k, depths = config.max_num_seqs, shapes.max_depth, shapes.depths
        if verifier is None:
            verifier = verifier_for(config, speculative=shapes.speculative, num_slots=n,
                                    max_depth=k)
        self.verifier = verifier
        self.mesh, layout = shapes.mesh, shapes.layout
        self.decode_buckets = shapes.decode_buckets
        # Over several processes, process 0 decides what follows measured times (multihost.py).
        lockstep = Lockstep() if layout is not None and layout.spans_processes else None
        start = time.perf_counter()
        self.runner = ModelRunner(model, drafter, num_slots=n, cache_len=shapes.cache_len,
                                  max_depth=k, prefill_buckets=shapes.prefill_buckets,
                                  decode_buckets=shapes.decode_buckets,
                                  draft_depths=depths, verifier=verifier,
                                  show_progress=config.show_progress, layout=layout,
                                  precompile_sampling=config.precompile_sampling,
                                  compile_on_first_use=config.compile_on_first_use,
                                  row_tile=(BATCH_INVARIANT_ROW_TILE if config.batch_invariant
                                            else None),
                                  # the floor (depth 0) is a dynamic planner's choice alone
                                  defer_commit=spec.policy is Policy.DYNAMIC)
        self.compile_seconds = time.perf_counter() - start
        announce(config, model, shapes, synthetic=verifier.name,
                 compile_seconds=self.compile_seconds)
        self.planning = StepPlanning(config, model, self.runner, drafter, depths=depths,
                                     lockstep=lockstep)
        self.runner.warm_up()  # an executable's first run is slow: pay it here, not in a step
        self.stats = EngineStats(synthetic_acceptance=verifier.name)
        self.scheduler = Scheduler(num_slots=n, max_rows=config.max_num_batched_tokens,
                                   replicas=self.runner.replicas,
                                   admission_interval=config.admission_interval)
        self._requests: dict[str, Request] = {}  # live or not yet reported as finished
        self._aborted: list[Request] = []  # aborted since the last step(), to report
        self._in_flight: InFlight | None = None
        self._observers: list[Callable[[StepEvent], None]] = []
        self._rng = np.random.default_rng(config.seed)
        self._auto_id = 0
        self._steps = 0
        self._plan_ms = 0.0  # planner time within the current step()
        self._report_unfinished = True  # step() reports every request touched (generate(): no)
        self._last_readback = None  # the last decode step's read-back, on the device

    @property
    def planner(self):
        """The step planner (lightspec_jax.planner); None for plain decoding."""
        return self.planning.planner

    @planner.setter
    def planner(self, planner) -> None:  # tests and tools script the plans
        self.planning.planner = planner

    @property
    def cost_profile(self):
        """The prices the planner started from (costs.CostProfile); None without a sweep."""
        return self.planning.cost_profile

    @classmethod
    def from_pretrained(cls, target_path: str, drafter_path: str | None = None, *,
                        config: EngineConfig = EngineConfig()) -> "Engine":
        """Loads a Qwen3 target (Hugging Face or converted directory; nothing is downloaded) and,
        optionally, a drafter for it: an Eagle3 drafter (Hugging Face layout: EAGLE/SpecForge
        or speculators), a DFlash (z-lab layout) or DSpark (DeepSpec layout) block drafter or a
        small Qwen3 causal LM sharing the target's vocabulary (a draft LM, as transformers'
        assisted generation uses), told apart by config.json. With
        SpeculativeConfig(method="ngram") no drafter is loaded: drafts come from prompt
        lookup."""
        from .loading import load_pretrained

        model, drafter, tokenizer, eos = load_pretrained(target_path, drafter_path, config)
        return cls(model, config=config, tokenizer=tokenizer, eos_token_ids=eos,
                   drafter=drafter)

    # --- public API -------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | Sequence[int],
                    params: SamplingParams | None = None) -> None:
        """Queues a request; raises RequestError (and changes nothing) if it is invalid."""
        request = self._make_request(request_id, prompt, params or SamplingParams())
        self._requests[request.request_id] = request
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        """Stops a request; the next step() reports it finished with reason 'abort'."""
        request = self._requests.get(request_id)
        if request is None or request.finished:
            raise RequestError(f"cannot abort {request_id!r}: no unfinished request has this id")
        self.scheduler.abort(request)
        self._aborted.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or self._in_flight is not None

    def add_step_observer(self, observer: Callable[[StepEvent], None]) -> None:
        """Calls `observer(StepEvent)` after every step is read back: its record (plan shape,
        counts, host and wait times), the plan, and the per-slot read-back."""
        self._observers.append(observer)

    def remove_step_observer(self, observer: Callable[[StepEvent], None]) -> None:
        """Stops calling an observer given to add_step_observer (ValueError if it was not)."""
        self._observers.remove(observer)

    def step_records(self) -> list[StepRecord]:
        """The most recent steps' records, oldest first (a bounded ring buffer)."""
        return list(self.stats.steps)

    def step(self) -> list[RequestOutput]:
        """Runs one engine step; returns each request that produced tokens or finished.

        The step dispatches new device work before reading the previous step's results (one
        step in flight with `overlap`), so its outputs are the previous step's - except when
        the step in flight may end every request it decodes (`_may_drain`): then it reads
        first, so that no step is spent on finished requests and the next prompt's prefill
        starts a step earlier. The device ends a request at its stop id or allowance by
        itself, so nothing past the end is emitted.
        """
        start, compiled = time.perf_counter(), lazy_compile_events()
        with CompileWatch("Engine.step", enabled=self.config.forbid_recompile):
            touched, self._aborted = self._aborted, []
            flight = event = None
            drain = self._may_drain()
            if drain:  # read the step in flight before scheduling the next
                changed, event, wait_ms = self._postprocess(self._in_flight)
                self._in_flight = None
                touched += changed
            if self.scheduler.has_work():
                flight = self._run(self.scheduler.schedule())
            # Host time is priced by whether the step dispatched drafting (planner.base).
            drafted = bool(flight and flight.plan and flight.plan.draft_depth > 0)
            # A step that compiled a variant on first use is no sample of a decode step's
            # host time or period (a compile costs hundreds of ms: one such sample priced a
            # regime several-fold off, and the planner never went back to correct it), nor is
            # a step that read before dispatching (the loop did not overlap there). One that
            # dispatched a prompt chunk is, less that dispatch (PlannerFeedback.record).
            sample = not drain
            prompt_ms = flight.prefill_ms if flight and flight.prefill_rows else None
            if self.config.overlap:
                flight, self._in_flight = self._in_flight, flight
            if flight is not None:
                changed, event, wait_ms = self._postprocess(flight)
                touched += changed
            outputs = self._outputs(touched)
        elapsed = time.perf_counter() - start
        self.stats.busy_seconds += elapsed
        self.stats.tokens += sum(len(o.new_token_ids) for o in outputs)
        if event is not None:
            sample = sample and lazy_compile_events() == compiled
            self._observe(event, host_ms=1e3 * elapsed - wait_ms, drafted=drafted,
                          sample=sample, prompt_ms=prompt_ms)
        return outputs

    def generate(self, prompts: Sequence[str | Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Serves `prompts` to completion; outputs come back in prompt order."""
        if self.has_unfinished_requests():
            raise RuntimeError("generate() needs an idle engine: requests added with "
                               "add_request() are still unfinished (drive them with step())")
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("generate() takes a list of prompts; wrap a single prompt in a list")
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        requests, ids = [], set()  # ids: a set, so that validating n prompts costs O(n)
        for i, (prompt, p) in enumerate(zip(prompts, params)):  # validate all, then queue
            self._auto_id += 1
            requests.append(self._make_request(f"generate-{self._auto_id}", prompt, p,
                                               pending=ids, who=f"prompt {i}"))
            ids.add(requests[-1].request_id)
        for request in requests:
            self._requests[request.request_id] = request
            self.scheduler.add(request)
        results: dict[str, RequestOutput] = {}
        self._report_unfinished = False  # generate() returns finished requests alone
        try:
            while self.has_unfinished_requests():
                for out in self.step():
                    if out.finished:
                        results[out.request_id] = out
        finally:
            self._report_unfinished = True
        if self.planning.feedback is not None:
            self.planning.feedback.save()
        return [results[r.request_id] for r in requests]

    # --- one step ---------------------------------------------------------------------------

    def _may_drain(self) -> bool:
        """Whether the decode step in flight may end every request it decodes: each one's
        remaining allowance is at most the tokens the step can emit (its verified depth + 1;
        exactly 1 for plain decoding). A step dispatched before reading it would then verify
        only finished requests - at c=1, one wasted step per request, and the next prompt's
        prefill queued behind it. Ends at a stop id cannot be foreseen and are not counted."""
        flight = self._in_flight
        if flight is None or flight.plan is None or flight.plan.num_requests == 0:
            return False
        decoding = self.scheduler.decoding
        remaining = self.scheduler.remaining[decoding]
        return bool(remaining.size) and bool(
            remaining.max() <= flight.plan.verified_depth + 1)

    def _run(self, batch) -> InFlight:
        """Plans and dispatches a scheduled step; never waits for the device."""
        runner, scheduler = self.runner, self.scheduler
        started = time.perf_counter()
        if batch.writes:
            self.verifier.admit(np.array([s for s, r in batch.writes if r is not None], int))
            runner.write(batch.writes)
        first, where = runner.prefill(batch.prefills) if batch.prefills else (None, None)
        prefill_ms = 1e3 * (time.perf_counter() - started)
        plan = readback = conf = None
        # The previous decode still running means the device is busy: no idle gap before this.
        busy = self._last_readback is not None and not self._last_readback.is_ready()
        if batch.num_decoding:
            started = time.perf_counter()
            # The host's view of each request's remaining allowance lags the step in flight,
            # which emits at least one token per request.
            lag = int(self.config.overlap and self._in_flight is not None
                      and self._in_flight.readback is not None)
            plan = self.planning.plan(batch, scheduler, lag=lag)
            self._plan_ms += 1e3 * (time.perf_counter() - started)
            # A step verifies drafts only if the step before drafted some (the floor: none).
            extra = self.verifier.host_inputs(scheduler.decoding,
                                              verifies=plan.verified_depth > 0)
            readback, conf = runner.decode(plan.verify_rows, plan.draft_depth, extra,
                                           mode=scheduler.sample_mode[scheduler.decoding].max(),
                                           span=plan.verified_depth + 1)
            scheduler.dispatched_decode(plan.draft_depth)
            self._last_readback = readback
        return InFlight(owners=list(scheduler.owner),
                        completing=[c.request for c in batch.prefills if c.completes_prompt],
                        first_tokens=first, first_index=where, readback=readback,
                        confidence=conf, plan=plan,
                        with_proposal=batch.with_proposal, prefill_rows=batch.prefill_rows,
                        prefill_ms=prefill_ms, context_len=batch.context_len,
                        busy_at_enqueue=busy, dispatched_at=time.perf_counter())

    def _postprocess(self, flight: InFlight):
        """Reads a step back (one packed array) and lets the scheduler apply it."""
        start = time.perf_counter()
        last = flight.readback if flight.readback is not None else flight.first_tokens
        waited = last is not None and not last.is_ready()
        first = ([] if flight.first_tokens is None
                 else np.asarray(flight.first_tokens)[flight.first_index].tolist())
        readback = None if flight.readback is None else np.asarray(flight.readback)
        ready = time.perf_counter()
        wait_ms = 1e3 * (ready - start)
        changed = self.scheduler.postprocess(flight.owners, list(zip(flight.completing, first)),
                                             readback, self.runner.columns)
        record = dict(num_requests=0, verify_rows=0, used_rows=0, draft_depth=0, accepted=0,
                      emitted=0)
        if readback is not None:
            record.update(self._learn(flight, readback, waited, ready))
        self._steps += 1
        record = StepRecord(index=self._steps, prefill_rows=flight.prefill_rows, host_ms=0.0,
                            plan_ms=0.0,
                            wait_ms=wait_ms, seconds=ready - flight.dispatched_at, **record)
        return changed, StepEvent(record, flight.plan, readback, self.runner.columns), wait_ms

    def _learn(self, flight: InFlight, readback: np.ndarray, waited: bool, ready: float) -> dict:
        """The engine totals of a decode step and what the planner learns from it."""
        c, plan = self.runner.columns, flight.plan
        live = self.scheduler.last_live  # [N] slots whose tokens were applied
        accepted = readback[live, c.accepted]
        verified = readback[live, c.verified]
        t = self.stats.totals
        t.steps += int(live.sum())
        t.drafted += int(readback[live, c.offered].sum())
        t.verified += int(verified.sum())
        t.accepted += int(accepted.sum())
        feedback = self.planning.feedback
        if feedback is not None:
            self._plan_ms += feedback.learn(
                flight, readback, columns=c, live=live, remaining=self.scheduler.remaining,
                classes=self.scheduler.acceptance_class, waited=waited, ready=ready)
        return dict(num_requests=len(accepted), verify_rows=plan.verify_rows,
                    used_rows=int((verified + 1).sum()), draft_depth=plan.draft_depth,
                    accepted=int(accepted.sum()), emitted=int(readback[live, c.emitted].sum()))

    def _observe(self, event: StepEvent, host_ms: float, drafted: bool, sample: bool,
                 prompt_ms: float | None) -> None:
        """Records a read-back step, hands it to the planner's feedback (`sample`: the step()
        call that read it compiled nothing and overlapped; `prompt_ms`: the host ms it spent
        dispatching slot writes and prompt chunks, None if it dispatched no chunk) and to the
        step observers."""
        event = dataclasses.replace(event, record=dataclasses.replace(
            event.record, host_ms=host_ms, plan_ms=self._plan_ms))
        self._plan_ms = 0.0
        self.stats.record(event.record)
        feedback = self.planning.feedback
        if feedback is not None:
            feedback.record(event, host_ms=host_ms, prompt_ms=prompt_ms, drafted=drafted,
                            sample=sample, decode_steps=self.stats.decode_steps)
        for observer in self._observers:
            observer(event)

    def _outputs(self, touched: list[Request]) -> list[RequestOutput]:
        """One report per request touched (in first-touch order); finished ones leave the
        engine's table. At high concurrency this is hundreds of requests a step, in the
        loop's host time: the per-request work is the report alone, and inside generate(),
        which returns finished requests only, the others get none (`_report_unfinished`:
        0.2-0.5 ms a step at c = 256 on the CPU's near-free model, about a tenth of the
        step's host time)."""
        # Speculative counters: final once finished, until then read from the scheduler.
        live = None if self.planning.planner is None else self.scheduler
        requests, outputs, every = self._requests, [], self._report_unfinished
        for request in dict.fromkeys(touched):
            if request.finish_reason is not None:
                requests.pop(request.request_id, None)
            elif not every:
                continue
            outputs.append(request.report(None if live is None else request.spec or live))
        return outputs

    # --- requests ---------------------------------------------------------------------------

    def _make_request(self, request_id, prompt, params, pending=frozenset(),
                      who=None) -> Request:
        if request_id in self._requests or request_id in pending:
            raise RequestError(f"duplicate request id {request_id!r}: a request with this id "
                               "is still unfinished")
        return make_request(request_id, prompt, params, who=who,
                            draw_seed=lambda: int(self._rng.integers(0, 2**32)),
                            tokenizer=self.tokenizer, vocab_size=self.vocab_size,
                            max_model_len=self.config.max_model_len,
                            eos_token_ids=self.eos_token_ids)
