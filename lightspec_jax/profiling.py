"""The bucket sweep: time each compiled verify bucket and draft stage to seed the cost tables.

Every verify bucket B runs with all slots active and full proposals at a fixed context, so the
table shows how the verify cost follows B at fixed N; the drafter's commit forward is timed per
B (the planner's D(B)), and the drafting stage once per depth d (the planner's depth table: the
stage runs all slots in one compiled loop, so it is priced as measured, not as d - 1 more
commit-like forwards). Each cost is the fastest of `repeats` timed runs after a warm-up run,
each on a fresh copy of the synthetic state: interference from other work on the machine only
ever adds time, so the minimum is the estimate least disturbed by it (a median of three still
moves with a busy neighbour).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from lightspec_jax.planner import CostTable

from .spec_runner import SpecRunner, SpecState


@dataclasses.dataclass(frozen=True)
class CostProfile:
    target: CostTable  # verify ms by rows B
    draft: CostTable  # draft commit forward ms by rows B
    draft_depth_ms: dict[int, float]  # whole draft stage ms by depth d (all slots)
    depth: CostTable  # the same draft stage ms as a table keyed by depth d
    context_per_request: int
    num_slots: int

    def summary(self) -> dict:
        return {"verify_ms": {b: self.target.estimate(b) for b in self.target.rows},
                "draft_commit_ms": {b: self.draft.estimate(b) for b in self.draft.rows},
                "draft_depth_ms": self.draft_depth_ms,
                "context_per_request": self.context_per_request, "num_slots": self.num_slots}


def _synthetic_state(runner: SpecRunner, context: int) -> SpecState:
    n, k = runner.num_slots, runner.max_depth
    return SpecState(seq_len=jnp.full((n,), context, jnp.int32),
                     last_token=jnp.zeros((n,), jnp.int32),
                     draft_tokens=jnp.zeros((n, k), jnp.int32),
                     draft_conf=jnp.full((n, k), 0.5, jnp.float32),
                     proposal_len=jnp.full((n,), k, jnp.int32))


def _timed(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return 1e3 * (time.perf_counter() - start)


def profile_costs(runner: SpecRunner, *, context: int = 128, repeats: int = 5,
                  show_progress: bool = True) -> CostProfile:
    context = max(1, min(context, runner.cache_len - 2 * runner.max_depth - 2))
    n = runner.num_slots
    verify_ms, commit_ms, depth_ms = {}, {}, {}
    carry = handoff = None
    for rows in tqdm(runner.verify_registry.sizes, desc="profiling verify buckets",
                     disable=not show_progress, leave=False):
        inputs = runner.empty_spec_inputs()
        inputs.active[:min(n, rows)] = True  # fill needs B >= active slots
        inputs.remaining[:] = 1 << 20
        v, c = [], []
        for _ in range(repeats + 1):
            runner.state = _synthetic_state(runner, context)
            out = {}
            v.append(_timed(lambda: out.setdefault("v", runner.run_verify(inputs, rows=rows))))
            handoff = out["v"][0]
            c.append(_timed(lambda: out.setdefault("c", runner.run_commit(handoff, rows=rows))))
            carry = out["c"]
        verify_ms[rows] = min(v[1:])
        commit_ms[rows] = min(c[1:])
    for depth in runner.depths:
        times = [_timed(lambda: runner.run_draft(carry, handoff.stepped, depth=depth) or
                        runner.state) for _ in range(repeats + 1)]
        depth_ms[depth] = min(times[1:])
    runner.state = runner.empty_state()
    total_context = n * context
    return CostProfile(target=CostTable(verify_ms, context_len=total_context),
                       draft=CostTable(commit_ms, context_len=total_context),
                       draft_depth_ms=depth_ms,
                       # each depth re-reads the context: scale, not shift, across contexts
                       depth=CostTable(depth_ms, context_len=total_context, impute="scale"),
                       context_per_request=context, num_slots=n)
