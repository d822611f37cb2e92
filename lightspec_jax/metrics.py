"""Speculative decoding metrics, per request and per engine step.

Definitions, used everywhere (LightSpec's, from the LightLLM PR #1465 description):
  acceptance length  tokens committed per verify step, the bonus token included:
                     1 + accepted / steps (1.0 = speculation never helped)
  acceptance rate    accepted draft tokens / verified draft tokens
  verified rows      rows the target verified: each step's own row per request plus the
                     verified drafts (verified + steps); what the verification budget spends
"""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class SpecCounters:
    """Speculative counters of one request (RequestOutput.metrics) or of the whole engine."""

    steps: int = 0  # verify steps this request took part in
    drafted: int = 0  # draft tokens its proposals offered at those steps
    verified: int = 0  # draft tokens the target verified (excludes the target row)
    accepted: int = 0  # draft tokens accepted

    def __str__(self) -> str:
        return (f"acceptance length {self.acceptance_length:.2f} over {self.steps} verify "
                f"steps; {self.accepted}/{self.verified} verified drafts accepted (rate "
                f"{self.acceptance_rate:.2f}); {self.verified_rows} verified rows")

    @property
    def verified_rows(self) -> int:
        """Rows the target verified: the drafts plus each step's own row (LightLLM's count)."""
        return self.verified + self.steps

    @property
    def acceptance_length(self) -> float:
        """Tokens committed per verify step, bonus included (0.0 before any step)."""
        return 1.0 + self.accepted / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified draft tokens (0.0 when nothing was verified)."""
        return self.accepted / self.verified if self.verified else 0.0

    def add(self, *, drafted: int, verified: int, accepted: int) -> None:
        self.steps += 1
        self.drafted += drafted
        self.verified += verified
        self.accepted += accepted

    def snapshot(self) -> "SpecCounters":
        return dataclasses.replace(self)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One engine step as executed (plain or speculative), as read back one step late.

    Host time is the time the host spent inside step() not blocked on the device: scheduling,
    planning, dispatch and bookkeeping. The wait is the time it blocked reading results.
    """

    index: int  # engine steps so far
    num_requests: int  # N: requests verified (0: prefill only)
    verify_rows: int  # B: the compiled decode bucket (0: no decode step)
    used_rows: int  # rows that carried a token (target rows + verified drafts)
    draft_depth: int  # d drafted after this verify (0: none)
    accepted: int  # draft tokens accepted over all requests
    emitted: int  # tokens streamed (after stop ids / allowances)
    prefill_rows: int  # prompt rows prefilled in the same engine step
    host_ms: float  # host time of the engine step that read this step back
    plan_ms: float  # of which the planner's plan() and observe()
    wait_ms: float  # time the host blocked on the device to read this step
    seconds: float  # dispatch to read-back, host work included


@dataclasses.dataclass
class EngineStats:
    """Engine-wide counters and the most recent step records (a bounded ring buffer, so memory
    stays flat however long the engine serves; the totals cover every step)."""

    totals: SpecCounters = dataclasses.field(default_factory=SpecCounters)
    steps: collections.deque = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=4096))
    # Set when acceptance was drawn from a workload profile instead of exact match: such
    # figures measure real device costs under assumed acceptance, never the model pair.
    synthetic_acceptance: str | None = None
    decode_steps: int = 0  # steps with a decode (verify) part, over the engine's life
    verify_rows: int = 0  # their compiled rows, summed
    draft_depth: int = 0  # their draft depths, summed
    host_ms: float = 0.0  # host time of every step, summed
    num_steps: int = 0  # every engine step that read device work back
    tokens: int = 0  # tokens streamed to requests
    busy_seconds: float = 0.0  # time spent inside step()

    def record(self, rec: StepRecord) -> None:
        self.steps.append(rec)
        self.num_steps += 1
        self.host_ms += rec.host_ms
        if rec.verify_rows:
            self.decode_steps += 1
            self.verify_rows += rec.verify_rows
            self.draft_depth += rec.draft_depth

    @property
    def verify_rows_per_step(self) -> float:
        return self.verify_rows / self.decode_steps if self.decode_steps else 0.0

    def summary(self) -> dict:
        """Engine-wide figures (metrics.py's docstring defines the speculative ones):
        spec_steps (steps with a decode), acceptance_length, acceptance_rate, verified_rows,
        accepted, verify_rows_per_step (mean compiled bucket B), mean_draft_depth,
        host_ms_per_step (host time not blocked on the device), tokens, busy_seconds (time
        inside step()) and tokens_per_s over it."""
        t = self.totals
        n = self.decode_steps
        return {"synthetic_acceptance": self.synthetic_acceptance, "spec_steps": n,
                "acceptance_length": t.acceptance_length,
                "acceptance_rate": t.acceptance_rate, "verified_rows": t.verified_rows,
                "accepted": t.accepted, "verify_rows_per_step": self.verify_rows_per_step,
                "mean_draft_depth": self.draft_depth / n if n else 0.0,
                "host_ms_per_step": self.host_ms / self.num_steps if self.num_steps else 0.0,
                "tokens": self.tokens, "busy_seconds": self.busy_seconds,
                "tokens_per_s": self.tokens / self.busy_seconds if self.busy_seconds else 0.0}
