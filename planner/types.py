"""Plain data passed between a serving loop and a planner: numpy and the standard library only.

Axis legend used in every planner file:
  N  requests in the step            M  requests whose proposal exists (M <= N)
  K  maximum draft depth             d  draft depth (d_prev: depth of the proposal being verified)
  u  useful verify rows, N <= u <= N + M*d_prev (rows the device fills with real tokens)
  B  compiled verify bucket, the smallest bucket >= u (B - u rows are padding)
"""

from __future__ import annotations

import bisect
import enum
import math
from dataclasses import dataclass

import numpy as np


class DrafterKind(str, enum.Enum):
    """How the drafter produces a proposal; this decides the draft cost and the allowed depths."""

    # Eagle3-like: one draft forward over the verified rows, then one forward per extra depth.
    AUTOREGRESSIVE = "autoregressive"
    # DFlash/DSpark-like block drafter: one forward proposes the whole block, so d is always K.
    PARALLEL = "parallel"


def geometric_buckets(max_rows: int, *, steps_per_octave: int = 4) -> tuple[int, ...]:
    """Row buckets 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, ... up to and including >= max_rows.

    Between 2^k and 2^(k+1) there are `steps_per_octave` evenly spaced sizes (multiples of
    2^k / steps_per_octave), so padding to a bucket wastes at most 1/steps_per_octave of a row
    count — the usual trade between compiled executables and padding (peers.md §3, buckets).
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if steps_per_octave < 1:
        raise ValueError(f"steps_per_octave must be >= 1, got {steps_per_octave}")
    sizes = {1}
    base = 1
    while max(sizes) < max_rows:
        step = max(1, base // steps_per_octave)
        sizes.update(range(base, 2 * base + 1, step))
        base *= 2
    return tuple(sorted(sizes))


@dataclass(frozen=True, kw_only=True)
class PlannerSpec:
    """What the engine can run: compiled verify buckets, allowed draft depths, drafter kind.

    verify_buckets: compiled verify row counts, strictly increasing. The largest bucket bounds the
      number of requests per step: plan() raises ValueError when N exceeds it.
    draft_depths: depths the drafter may run, each in 1..max_depth. A parallel drafter that
      runs its whole block whatever it reads out (block_lead None) has one:
      draft_depths must be (max_depth,).
    floor: the engine can also run depth 0, a step that drafts nothing (its next step verifies
      one row per request) while its drafter stays current (the engine's verify step writes the
      drafter's cache at every depth): the no-speculation floor, priced like any depth.
    block_size: rows per request of one parallel-drafter forward (DFlash block); None for an
      autoregressive drafter. Defaults to max_depth for a parallel drafter.
    block_lead: a parallel drafter that cuts its block to the depth (DFlash): the block's rows
      besides its drafts (1, the bonus row), so drafting d tokens is a forward of
      block_lead + d rows per request (block_rows). None: the whole block, always.
    """

    verify_buckets: tuple[int, ...]
    draft_depths: tuple[int, ...]
    max_depth: int
    drafter_kind: DrafterKind = DrafterKind.AUTOREGRESSIVE
    block_size: int | None = None
    block_lead: int | None = None
    floor: bool = False

    def __post_init__(self) -> None:
        buckets = tuple(int(b) for b in self.verify_buckets)
        if not buckets:
            raise ValueError("verify_buckets is empty; give at least one compiled row count")
        if any(b < 1 for b in buckets) or any(a >= b for a, b in zip(buckets, buckets[1:])):
            raise ValueError(
                f"verify_buckets must be positive and strictly increasing, got {buckets}")
        if not isinstance(self.max_depth, (int, np.integer)) or self.max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1, got {self.max_depth!r}")
        kind = DrafterKind(self.drafter_kind)
        depths = tuple(sorted({int(d) for d in self.draft_depths}))
        if not depths or depths[0] < 1 or depths[-1] > self.max_depth:
            raise ValueError(
                f"draft_depths must be a non-empty subset of 1..{self.max_depth}, got "
                f"{tuple(self.draft_depths)}")
        block = self.block_size
        lead = self.block_lead
        if kind is DrafterKind.PARALLEL:
            if lead is None and depths != (self.max_depth,):
                raise ValueError(
                    f"a parallel drafter that runs its whole block drafts one depth: "
                    f"draft_depths must be ({self.max_depth},), got {depths} (a drafter that "
                    f"cuts its block to the depth sets block_lead)")
            block = self.max_depth if block is None else int(block)
            if block < 1:
                raise ValueError(f"block_size must be >= 1, got {block}")
            if lead is not None and not 0 <= lead <= block - self.max_depth:
                raise ValueError(f"block_lead must be in [0, block_size - max_depth = "
                                 f"{block - self.max_depth}], got {lead}")
        elif block is not None or lead is not None:
            raise ValueError("block_size and block_lead apply to parallel drafters only; leave "
                             "them None")
        object.__setattr__(self, "verify_buckets", buckets)
        object.__setattr__(self, "draft_depths", depths)
        object.__setattr__(self, "max_depth", int(self.max_depth))
        object.__setattr__(self, "drafter_kind", kind)
        object.__setattr__(self, "block_size", block)
        object.__setattr__(self, "block_lead", None if lead is None else int(lead))
        object.__setattr__(self, "floor", bool(self.floor))

    def block_rows(self, depth: int) -> int:
        """Rows per request of the parallel drafter's forward that drafts `depth` tokens."""
        return self.block_size if self.block_lead is None else self.block_lead + depth

    @property
    def choices(self) -> tuple[int, ...]:
        """Depths plan() may choose: the draft depths, after 0 when the floor is offered."""
        return ((0,) if self.floor else ()) + self.draft_depths

    @property
    def max_requests(self) -> int:
        """Most requests one step can hold: every request needs its own target row."""
        return self.verify_buckets[-1]

    def bucket_for(self, rows: int) -> int:
        """Smallest compiled bucket >= rows (a padded shape costs its bucket)."""
        i = bisect.bisect_left(self.verify_buckets, rows)
        if i == len(self.verify_buckets):
            raise ValueError(
                f"{rows} verify rows exceed the largest compiled bucket "
                f"{self.verify_buckets[-1]}; compile a larger bucket or admit fewer requests")
        return self.verify_buckets[i]


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """The planner's decision for one decode step.

    The device fills `fill_rows` real rows (top-u by prefix survival of draft confidences; every
    request keeps its target row) and runs the compiled `verify_rows` bucket; the other
    verify_rows - fill_rows rows are padding that costs but accepts nothing. Statistics are keyed
    by (num_requests, fill_rows, verified_depth), the executed configuration.
    """

    num_requests: int  # N
    num_with_proposal: int  # M
    verified_depth: int  # d_prev: depth of the proposal this step verifies
    fill_rows: int  # u: N <= u <= N + M*d_prev (0 for an empty step)
    verify_rows: int  # B: smallest compiled bucket >= u (0 for an empty step)
    draft_depth: int  # d: depth to draft after this verify
    update_stats: bool  # False for steps with no proposal to learn from (M = 0 or d_prev = 0)
    reason: str  # "empty" | "cold" | "plan" | "probe" | "visit" | "static" | "capacity"
    # Rows a full-width verify of this proposal fills: N + each request's drafts, cut at its
    # remaining allowance (0: N(d_prev + 1), no ends known).
    full_rows: int = 0
    # Planner's estimate of the step's wall ms (device, and host time overlap does not hide).
    predicted_ms: float = math.nan
    predicted_tokens: float = math.nan  # planner's estimate of committed tokens (NaN if unknown)

    @property
    def probe(self) -> bool:
        """True for an exploration step (full-width verify that refreshes deep statistics)."""
        return self.reason == "probe"

    @property
    def at_floor(self) -> bool:
        """True for a floor step: it verifies no proposal and drafts none."""
        return self.verified_depth == 0 and self.draft_depth == 0


@dataclass(frozen=True, kw_only=True, eq=False)
class StepObservation:
    """What happened in a step, reported after it ran (possibly after the next plan()).

    accept_lens: [N] int, tokens each request committed, bonus included (1..d_prev+1), in the
      order the engine uses for its requests. Report what verification accepted, before any
      stop-token or max-length truncation, so statistics are not biased by finishing requests.
    target_ms: measured target verify time at plan.verify_rows; None if not measured.
    draft_ms: measured time of the whole draft run after the verify (all depths); None if not
      measured. The planner splits it over the draft table's entries in proportion to their
      current estimates.
    step_ms: measured device time of one step's worth of work, a verify and a draft run timed
      together, for engines that cannot time the two apart; split over the target and draft
      tables in proportion to their current estimates. When given, target_ms and draft_ms are
      ignored.
    draft_plan: the plan whose draft run step_ms includes, if not this one: an engine that reads
      a step's results when its verify ends times the previous step's draft run with this
      step's verify.
    context_len: KV tokens the step attended, summed over the batch's requests. Costs are keyed
      by it because attention reads every request's KV once per step.
    verify_lens: [N] int, rows verified per request including its target row; optional, used
      to keep requests whose proposal was cut at their allowance out of the survival, by the
      interpolation estimator, and for consistency checks.
    sampling_classes: [N] the requests' sampling classes (as given to plan()), so greedy and
      sampled requests, or different temperatures, keep separate statistics.
    had_proposal: [N] bool, the requests that held a proposal (M of them); statistics learn from
      these alone. A request admitted since the last step verifies only its target row, which
      says nothing about acceptance. None: a step planned with M = N, or a mixed step (M < N)
      that cannot say which requests held one, which then teaches nothing - under continuous
      batching at high concurrency nearly every step admits someone, so an engine should say.
    uncensored: [N] bool, the requests whose proposal was verified as far as it went: their
      undrafted positions count as rejected in the survival. None: those that verified the
      whole depth (verify_lens == d + 1). A drafter that may propose fewer than d tokens
      (n-gram lookup) sets it, so that a short proposal is a miss, not a censored sample.
    """

    plan: StepPlan
    accept_lens: np.ndarray
    target_ms: float | None = None
    draft_ms: float | None = None
    context_len: int | None = None
    step_ms: float | None = None
    draft_plan: StepPlan | None = None
    verify_lens: np.ndarray | None = None
    sampling_classes: np.ndarray | None = None
    had_proposal: np.ndarray | None = None
    uncensored: np.ndarray | None = None
