"""Host-side request state (plain Python) and what the engine reports back."""

from __future__ import annotations

import dataclasses
import enum

from .config import SamplingParams
from .metrics import SpecCounters


from .errors import RequestError  # noqa: F401  (re-exported: its historical home)


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS or a stop token id (included in token_ids)
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"


class RequestOutput:
    """What step() and generate() report for a request.

    `new_token_ids`, `finished` and `finish_reason` are set when it is built; `token_ids`,
    `prompt_token_ids`, `text` and `metrics` are computed when read, so a serving loop pays
    only for what it looks at (a step at high concurrency reports hundreds of requests).
    """

    __slots__ = ("request_id", "new_token_ids", "finished", "finish_reason", "_request",
                 "_count", "_metrics")

    def __init__(self, request: "Request", new_token_ids: list[int], count: int, metrics):
        reason = request.finish_reason
        self.request_id = request.request_id
        self.new_token_ids = new_token_ids  # generated since the previous report
        self.finished = reason is not None
        self.finish_reason = None if reason is None else reason.value
        self._request = request
        self._count = count
        self._metrics = metrics

    @property
    def token_ids(self) -> list[int]:
        """Every generated token up to this report."""
        return self._request.output_token_ids[:self._count]

    @property
    def prompt_token_ids(self) -> list[int]:
        return list(self._request.prompt_token_ids)

    @property
    def text(self) -> str | None:
        """token_ids decoded (None without a tokenizer), incrementally across reports."""
        detok = self._request.detokenizer
        return None if detok is None else detok.update(self._request.output_token_ids,
                                                       self._count)

    @property
    def metrics(self) -> SpecCounters | None:
        """Speculative counters (None in plain decoding): final once finished, else as of
        when read."""
        source = self._metrics  # SpecCounters, None, or the scheduler that counts them
        if source is None or isinstance(source, SpecCounters):
            return source
        return source.counters_of(self._request)

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id!r}, new_token_ids="
                f"{self.new_token_ids!r}, finished={self.finished}, "
                f"finish_reason={self.finish_reason!r}, tokens={self._count})")


@dataclasses.dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # resolved: the request's own seed or one drawn from the engine
    stop_ids: frozenset[int]
    allowance: int  # tokens it may emit: max_tokens, capped by max_model_len
    slot: int | None = None
    num_prefilled: int = 0  # prompt tokens whose K/V are in the cache
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    num_reported: int = 0  # output tokens already handed out by step()
    finish_reason: FinishReason | None = None
    spec: SpecCounters | None = None  # final counters, set when it finishes
    detokenizer: object | None = None  # tokenizer.IncrementalDetokenizer, if there is one

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def prefill_done(self) -> bool:
        return self.num_prefilled == self.prompt_len

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def total_len(self) -> int:
        return self.prompt_len + len(self.output_token_ids)

    def report(self, metrics) -> RequestOutput:
        """The output since the last report; `metrics` is SpecCounters, None, or an object
        whose counters_of(request) gives them when read (the scheduler)."""
        count = len(self.output_token_ids)
        new = self.output_token_ids[self.num_reported:count]
        self.num_reported = count
        return RequestOutput(self, new, count, metrics)
