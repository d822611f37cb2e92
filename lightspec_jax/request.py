"""Host-side request state (plain Python) and what the engine reports back."""

from __future__ import annotations

import dataclasses
import enum

from .config import SamplingParams
from .metrics import SpecCounters


class RequestError(ValueError):
    """A bad request, refused at the call that made it; other requests are not affected."""


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS or a stop token id (included in token_ids)
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"


@dataclasses.dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # every generated token so far
    new_token_ids: list[int]  # generated since the previous report of this request
    finished: bool
    finish_reason: str | None
    text: str | None = None  # decoded token_ids when the engine has a tokenizer
    metrics: SpecCounters | None = None  # speculative counters (None in plain decoding)


@dataclasses.dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # resolved: the request's own seed or one drawn from the engine
    stop_ids: frozenset[int]
    slot: int | None = None
    num_prefilled: int = 0  # prompt tokens whose K/V are in the cache
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    num_reported: int = 0  # output tokens already handed out by step()
    finish_reason: FinishReason | None = None
    proposal_len: int = 0  # draft tokens the device holds for the next verify
    spec: SpecCounters | None = None

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

    def report(self, text: str | None = None) -> RequestOutput:
        new = self.output_token_ids[self.num_reported:]
        self.num_reported = len(self.output_token_ids)
        return RequestOutput(
            request_id=self.request_id, prompt_token_ids=list(self.prompt_token_ids),
            token_ids=list(self.output_token_ids), new_token_ids=list(new),
            finished=self.finished,
            finish_reason=None if self.finish_reason is None else self.finish_reason.value,
            text=text, metrics=None if self.spec is None else self.spec.snapshot())
