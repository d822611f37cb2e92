"""Continuous batching over a fixed number of KV slots, and the only code that changes a
request after it is queued (host only: plain Python and numpy).

`schedule()` admits waiting requests into free slots in arrival order and hands the prompt
row budget (max_num_batched_tokens) to prefill chunks, oldest first, so a long prompt is
spread over several steps instead of stalling running decodes. `postprocess()` applies a step's
read-back: it appends tokens, ends requests and updates the per-slot counters, vectorised
over slots; only requests that produced tokens are touched one by one.

The device decides which slots decode (batch.py); the host mirrors it one step late in
`decoding`, which can only over-count (a request the device already ended), so a decode
bucket sized from it always holds every active slot. With D data-parallel replicas, each
verifying B / D rows of its own slots, requests are admitted to the least-loaded replica and
the bucket is sized by the busiest one (`rows_needed`); each replica prefills its own
prompts in max_rows / D rows a step.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from ..metrics import SpecCounters
from ..request import FinishReason, Request


def replica_loads(mask: np.ndarray, replicas: int) -> np.ndarray:
    """[D] how many of the slots marked in `mask` [N] bool each of the D data-parallel
    replicas holds (replica r: slots [r N/D, (r+1) N/D), engine/sharding.py)."""
    return np.asarray(mask, bool).reshape(replicas, -1).sum(axis=1)


def rows_needed(mask: np.ndarray, replicas: int) -> int:
    """The fewest verify rows that give every slot marked in `mask` [N] its row when each of
    the D replicas verifies B / D rows of its own slots: D x the busiest replica's count."""
    return int(replicas * replica_loads(mask, replicas).max()) if len(mask) else 0


def spread_slots(num_slots: int, replicas: int, count: int) -> np.ndarray:
    """[N] bool: `count` slots spread evenly over the replicas (the i-th slot of replica r is
    taken when i D + r < count), the order in which the scheduler fills an empty engine."""
    local = np.arange(num_slots) % (num_slots // replicas)
    replica = np.arange(num_slots) // (num_slots // replicas)
    return local * replicas + replica < count


@dataclasses.dataclass(frozen=True)
class PrefillChunk:
    request: Request
    start: int  # first prompt position of the chunk
    length: int

    @property
    def completes_prompt(self) -> bool:
        return self.start + self.length == self.request.prompt_len


@dataclasses.dataclass(frozen=True)
class ScheduledStep:
    """What one engine step dispatches: slot writes, prompt chunks, and a decode step over the
    `num_decoding` slots the device will find active."""

    writes: tuple[tuple[int, Request | None], ...]  # (slot, admitted request or None: leave)
    prefills: tuple[PrefillChunk, ...]
    num_decoding: int
    with_proposal: np.ndarray  # [N] bool: decoding slots a draft run gave a proposal
    context_len: int  # committed tokens of the decoding requests (the planner's cost axis)

    @property
    def num_with_proposal(self) -> int:
        return int(self.with_proposal.sum())

    @property
    def prefill_rows(self) -> int:
        return sum(c.length for c in self.prefills)


class Scheduler:
    def __init__(self, *, num_slots: int, max_rows: int, replicas: int = 1,
                 admission_interval: int = 1):
        self.num_slots = num_slots
        self.max_rows = max_rows
        self.replicas = replicas
        self.admission_interval = admission_interval  # EngineConfig.admission_interval
        self._since_admission = admission_interval  # schedule() calls since the last one
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: dict[int, Request] = {}  # slot -> request, in admission order
        self.prefilling: dict[int, Request] = {}  # the running requests with prompt left
        self.owner: list[Request | None] = [None] * num_slots  # slot -> request
        self._free_slots = list(range(num_slots - 1, -1, -1))  # pop() gives the lowest slot
        self._writes: dict[int, Request | None] = {}  # pending slot writes, last one wins
        n = num_slots
        self.decoding = np.zeros(n, bool)  # host view of the device's active slots
        self.has_proposal = np.zeros(n, bool)
        self.total_len = np.zeros(n, np.int64)
        self.remaining = np.zeros(n, np.int64)  # tokens each slot's request may still emit
        self.acceptance_class = np.zeros(n, np.int64)  # SamplingParams.acceptance_class
        self.sample_mode = np.zeros(n, np.int64)  # SamplingParams.sample_mode
        # Speculative counters per slot (SpecCounters fields), reset at admission.
        self.counters = np.zeros((4, n), np.int64)  # steps, drafted, verified, accepted
        self.last_live = np.zeros(n, bool)  # slots whose decode tokens the last read applied

    # --- queueing ---------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request: Request) -> None:
        slot = request.slot
        self.finish(request, FinishReason.ABORT)
        if slot is not None and slot not in self._writes:
            self._writes[slot] = None  # the device must stop decoding it

    def _take_slot(self) -> int:
        """The lowest free slot of the replica that holds the fewest requests."""
        if self.replicas == 1:
            return self._free_slots.pop()
        held = replica_loads([r is not None for r in self.owner], self.replicas)
        per = self.num_slots // self.replicas
        slot = min(self._free_slots, key=lambda s: (held[s // per], s))
        self._free_slots.remove(slot)
        return slot

    # --- one step ---------------------------------------------------------------------------

    def admits(self) -> bool:
        """Whether this step admits waiting requests into free slots: at once when nothing
        decodes (a slot would only idle), else once every `admission_interval` steps."""
        return (self._since_admission >= self.admission_interval
                or not self.decoding.any())

    def _admit(self, request: Request) -> None:
        slot = request.slot = self._take_slot()
        self.running[slot] = self.prefilling[slot] = request
        self.owner[slot] = request
        self._writes[slot] = request
        self.decoding[slot] = self.has_proposal[slot] = False
        self.total_len[slot] = request.prompt_len
        self.remaining[slot] = request.allowance
        self.acceptance_class[slot] = request.params.acceptance_class
        self.sample_mode[slot] = request.params.sample_mode
        self.counters[:, slot] = 0

    def schedule(self) -> ScheduledStep:
        self._since_admission += 1
        if self.waiting and self._free_slots and self.admits():
            self._since_admission = 0
            while self.waiting and self._free_slots:
                self._admit(self.waiting.popleft())
        # Prompt rows per step; decodes run in their own executable, sized by the planner.
        # Each data-parallel replica prefills its own slots' prompts in its share of the rows.
        per = self.num_slots // self.replicas
        budget = [self.max_rows // self.replicas] * self.replicas
        prefills = []
        for request in list(self.prefilling.values()):
            replica = request.slot // per
            if budget[replica] <= 0:
                continue
            length = min(request.prompt_len - request.num_prefilled, budget[replica])
            chunk = PrefillChunk(request, request.num_prefilled, length)
            prefills.append(chunk)
            request.num_prefilled += length  # counted at dispatch: never scheduled twice
            if chunk.completes_prompt:  # the device activates it in this step's prefill
                self.decoding[request.slot] = True
                del self.prefilling[request.slot]
            budget[replica] -= length
        writes = tuple(self._writes.items())
        self._writes.clear()
        decoding = self.decoding
        return ScheduledStep(writes=writes, prefills=tuple(prefills),
                             num_decoding=int(decoding.sum()),
                             with_proposal=decoding & self.has_proposal,
                             context_len=int(self.total_len[decoding].sum()))

    def dispatched_decode(self, depth: int) -> None:
        """Every decoding slot holds a proposal after a decode step that drafts."""
        self.has_proposal[self.decoding] = depth > 0

    def postprocess(self, owners: list, first_tokens: list[tuple[Request, int]],
                    readback: np.ndarray | None, columns) -> list[Request]:
        """Applies one step's read-back; returns the requests that produced tokens or ended.

        owners: slot -> request when the step was dispatched (a slot may have changed hands
        since; tokens of a request that already ended are dropped, never emitted).
        first_tokens: (request, token) of each prompt the step's prefill completed.
        readback: [N, K+1+5] decode read-back (batch.Readback `columns`), or None.
        """
        changed = []
        for request, token in first_tokens:
            if request.finished:
                continue
            request.output_token_ids.append(token)
            self.total_len[request.slot] += 1
            self.remaining[request.slot] -= 1
            if token in request.stop_ids:
                self.finish(request, FinishReason.STOP)
            elif (len(request.output_token_ids) >= request.allowance):
                self.finish(request, FinishReason.LENGTH)
            changed.append(request)
        if readback is None:
            return changed
        c = columns
        emitted = readback[:, c.emitted]  # [N]
        slots = np.flatnonzero(emitted)
        # One conversion to Python lists for all slots: numpy indexing per slot costs more.
        rows = readback[slots].tolist()
        at_emitted, at_finished = c.emitted, c.finished
        kept, ended = [], []
        for slot, row in zip(slots.tolist(), rows):
            request = owners[slot]
            if request is None or request.finish_reason is not None:  # aborted in flight
                continue
            kept.append(slot)
            new = row[:row[at_emitted]]
            request.output_token_ids.extend(new)
            changed.append(request)
            if row[at_finished]:
                ended.append((request, new[-1]))
        live = self.last_live = np.zeros(self.num_slots, bool)
        live[kept] = True
        self.total_len[live] += emitted[live]
        self.remaining[live] -= emitted[live]
        self.counters[0, live] += 1
        self.counters[1:, live] += readback[live][:, [c.offered, c.verified, c.accepted]].T
        for request, last in ended:  # after the counters: finishing snapshots them
            self.finish(request, FinishReason.STOP if last in request.stop_ids
                        else FinishReason.LENGTH)
        return changed

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Marks a request finished and frees its slot (its KV strip is simply reused)."""
        request.finish_reason = reason
        slot = request.slot
        if slot is not None and self.running.get(slot) is request:
            request.spec = self.spec_counters(slot)
            del self.running[slot]
            self.prefilling.pop(slot, None)
            self.owner[slot] = None
            self.decoding[slot] = False
            self._free_slots.append(slot)
            self._free_slots.sort(reverse=True)
        elif request in self.waiting:
            self.waiting.remove(request)

    def counters_of(self, request: Request) -> SpecCounters:
        """A request's speculative counters: final once it finished, else its slot's."""
        if request.spec is not None:
            return request.spec
        if request.slot is not None and self.owner[request.slot] is request:
            return self.spec_counters(request.slot)
        return SpecCounters()

    def spec_counters(self, slot: int) -> SpecCounters:
        steps, drafted, verified, accepted = self.counters[:, slot].tolist()
        return SpecCounters(steps=steps, drafted=drafted, verified=verified, accepted=accepted)
