"""Continuous batching over a fixed number of KV slots (host only, plain Python).

Each step: every request whose prompt is fully prefilled gets one decode row; waiting requests
are admitted into free slots in arrival order; the remaining row budget goes to prefill chunks,
oldest first, so a long prompt is spread over several steps instead of stalling the decodes.
"""

from __future__ import annotations

import collections
import dataclasses

from .request import FinishReason, Request


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
    decodes: tuple[Request, ...]
    prefills: tuple[PrefillChunk, ...]

    @property
    def num_rows(self) -> int:
        return len(self.decodes) + sum(c.length for c in self.prefills)


class Scheduler:
    def __init__(self, *, num_slots: int, max_rows: int):
        self.num_slots = num_slots
        self.max_rows = max_rows
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: dict[int, Request] = {}  # slot -> request, in admission order
        self._free_slots = list(range(num_slots - 1, -1, -1))  # pop() gives the lowest slot

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        while self.waiting and self._free_slots:
            request = self.waiting.popleft()
            request.slot = self._free_slots.pop()
            self.running[request.slot] = request
        decodes = tuple(r for r in self.running.values() if r.prefill_done)
        budget = self.max_rows - len(decodes)
        prefills = []
        for request in self.running.values():
            if budget <= 0:
                break
            if not request.prefill_done:
                length = min(request.prompt_len - request.num_prefilled, budget)
                prefills.append(PrefillChunk(request, request.num_prefilled, length))
                budget -= length
        return ScheduledStep(decodes, tuple(prefills))

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Marks a request finished and frees its slot (its KV strip is simply reused)."""
        request.finish_reason = reason
        if request.slot is not None and self.running.get(request.slot) is request:
            del self.running[request.slot]
            self._free_slots.append(request.slot)
            self._free_slots.sort(reverse=True)
        elif request in self.waiting:
            self.waiting.remove(request)
