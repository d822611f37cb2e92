"""Speculative decoding metrics, per request and per engine step.

Definitions (reference/lightspec-algorithm.md §14): acceptance length = committed tokens per
verify step including the bonus token (1 + accepted / steps); acceptance rate = accepted draft
tokens / verified draft tokens. Verified rows include each request's target row; verified
drafts do not - both are reported, labelled.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class SpecCounters:
    steps: int = 0  # verify steps this request took part in
    drafted: int = 0  # draft tokens its proposals offered at those steps
    verified: int = 0  # draft tokens the target verified (excludes the target row)
    accepted: int = 0  # draft tokens accepted

    @property
    def verified_rows(self) -> int:
        """Target rows verified, each step's own row included (LightLLM's convention)."""
        return self.verified + self.steps

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
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
    """One speculative engine step as executed."""

    num_requests: int  # N: requests verified
    verify_rows: int  # B: the compiled bucket verified
    used_rows: int  # rows that carried a token (target rows + verified drafts)
    draft_depth: int  # d drafted after this verify
    accepted: int  # draft tokens accepted over all requests
    emitted: int  # tokens streamed (after stop ids / allowances)
    seconds: float  # wall time of the step, host work included


@dataclasses.dataclass
class EngineStats:
    totals: SpecCounters = dataclasses.field(default_factory=SpecCounters)
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    # Set when acceptance was drawn from a workload profile instead of exact match: such
    # figures measure real device costs under assumed acceptance, never the model pair.
    synthetic_acceptance: str | None = None

    @property
    def verify_rows_per_step(self) -> float:
        return sum(s.verify_rows for s in self.steps) / len(self.steps) if self.steps else 0.0

    def summary(self) -> dict:
        t = self.totals
        n = len(self.steps)
        return {"synthetic_acceptance": self.synthetic_acceptance, "spec_steps": n,
                "acceptance_length": t.acceptance_length,
                "acceptance_rate": t.acceptance_rate, "verified_rows": t.verified_rows,
                "accepted": t.accepted, "verify_rows_per_step": self.verify_rows_per_step,
                "mean_draft_depth": sum(s.draft_depth for s in self.steps) / n if n else 0.0}
