"""Host side of speculative serving: builds each step's inputs, picks the budget, reads results.

An engine step with pending prompt chunks runs a prefill step (target + drafter caches); then
every request with a finished prompt takes part in one speculative step. The step's shape
(B verify rows, d next draft depth) comes from the policy; the device decides which rows.
"""

from __future__ import annotations

import time

import numpy as np

from .config import EngineConfig, Policy
from .metrics import EngineStats, SpecCounters, StepRecord
from .request import Request
from .runner import build_step_inputs
from .scheduler import ScheduledStep
from .spec_runner import MAX_STOP_IDS, PrefillExtras, SpecInputs, SpecRunner


def default_verify_buckets(max_rows: int) -> tuple[int, ...]:
    """Powers of two and their midpoints (1, 2, 3, 4, 6, 8, 12, ...) up to max_rows, inclusive."""
    out, b = {max_rows}, 1
    while b < max_rows:
        out.update(x for x in (b, b + b // 2) if x < max_rows)
        b *= 2
    return tuple(sorted(out))


class SpecBackend:
    def __init__(self, target, drafter, *, config: EngineConfig, cache_len: int,
                 prefill_buckets: tuple[int, ...]):
        spec = config.speculative
        self.config = config
        self.max_depth = spec.num_speculative_tokens
        self.num_slots = config.max_num_seqs
        max_rows = self.num_slots * (self.max_depth + 1)
        self.verify_buckets = config.verify_buckets or default_verify_buckets(max_rows)
        if self.verify_buckets[-1] < max_rows:
            raise ValueError(f"verify_buckets must reach max_num_seqs * (K + 1) = {max_rows} "
                             f"for the {spec.policy.value} policy, got {self.verify_buckets}")
        if spec.policy is not Policy.STATIC:
            raise NotImplementedError(f"policy {spec.policy.value!r} is not available yet")
        self.runner = SpecRunner(target, drafter, num_slots=self.num_slots, cache_len=cache_len,
                                 max_depth=self.max_depth, prefill_buckets=prefill_buckets,
                                 verify_buckets=self.verify_buckets, depths=(self.max_depth,),
                                 show_progress=config.show_progress)
        self.stats = EngineStats()

    @property
    def compile_seconds(self) -> float:
        return self.runner.compile_seconds

    def execute(self, batch: ScheduledStep) -> list[tuple[Request, list[int]]]:
        new_tokens = []
        if batch.prefills:
            new_tokens += self._prefill(batch)
        if batch.decodes:
            new_tokens += self._speculate(batch.decodes)
        return new_tokens

    def _prefill(self, batch: ScheduledStep) -> list[tuple[Request, list[int]]]:
        prefill_only = ScheduledStep(decodes=(), prefills=batch.prefills)
        rows = self.runner.prefill_registry.pick(prefill_only.num_rows)
        inputs = build_step_inputs(prefill_only, rows, self.num_slots)
        extras = self.runner.empty_extras(rows)
        row = 0
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
            row += chunk.length
        tokens = np.asarray(self.runner.run_prefill(inputs, extras))
        return [(c.request, [int(tokens[c.request.slot])])
                for c in batch.prefills if c.completes_prompt]

    def _speculate(self, decodes: tuple[Request, ...]) -> list[tuple[Request, list[int]]]:
        start = time.perf_counter()
        inputs = self.runner.empty_spec_inputs()
        for request in decodes:
            slot, p = request.slot, request.params
            inputs.active[slot] = True
            inputs.temperature[slot] = p.temperature
            inputs.top_k[slot] = p.top_k
            inputs.top_p[slot] = p.top_p
            inputs.seed[slot] = request.seed
            stops = sorted(request.stop_ids)
            inputs.stop_ids[slot, :len(stops)] = stops
            inputs.remaining[slot] = min(request.params.max_tokens - len(request.output_token_ids),
                                         self.config.max_model_len - request.total_len)
        wanted = sum(1 + r.proposal_len for r in decodes)  # static: verify every draft
        rows = self.runner.verify_registry.pick(wanted)
        depth = self.max_depth
        result = self.runner.run_spec(inputs, rows=rows, depth=depth)
        out_tokens, emitted, accepted, verified, stepped = (
            np.asarray(x) for x in (result.out_tokens, result.num_emitted, result.accepted,
                                    result.verified, result.stepped))
        new_tokens = []
        for request in decodes:
            slot = request.slot
            if not stepped[slot]:
                raise RuntimeError(f"request {request.request_id!r} in slot {slot} got no verify "
                                   f"row in a bucket of {rows} rows for {len(decodes)} requests")
            request.spec.add(drafted=request.proposal_len, verified=int(verified[slot]),
                             accepted=int(accepted[slot]))
            self.stats.totals.add(drafted=request.proposal_len, verified=int(verified[slot]),
                                  accepted=int(accepted[slot]))
            request.proposal_len = depth
            new_tokens.append((request, out_tokens[slot, :emitted[slot]].tolist()))
        self.stats.steps.append(StepRecord(
            num_requests=len(decodes), verify_rows=rows,
            used_rows=int(sum(verified[r.slot] + 1 for r in decodes)), draft_depth=depth,
            accepted=int(sum(accepted[r.slot] for r in decodes)),
            emitted=int(sum(emitted[r.slot] for r in decodes)),
            seconds=time.perf_counter() - start))
        return new_tokens
