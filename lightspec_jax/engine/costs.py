"""The bucket sweep: time the compiled decode step per verify bucket and per draft depth to
seed the planner's cost tables.

A decode step is the verify executable of its bucket B (which also writes the drafter's cache)
and, unless the planner drafts nothing, the draft executable of its depth d, so the sweep
times what the engine runs: every bucket B at depth 0 with all slots active and full
proposals at a fixed context (the verify, how the step cost follows B at fixed N), and the
bucket holding N at each depth d, each against a depth-0 twin. The planner prices a step as
target(B) + draft(B) + stage(d), the last two only when it drafts: stage(d) is the draft
step (depth d less depth 0, over the N slots), and draft(B), the part of drafting that
follows B, is nil here: the verify step's drafter cache writes run at every depth - except
for a drafter that catches up (the draft LM, drafters/base.py), whose floor steps over the
buckets up to N only record the rows: there target(B) is that step, and draft(B) the
committing step less it (the commit forward a drafting step runs).

Each cost is the fastest of `repeats` timed runs of `steps` back-to-back steps after a
warm-up run, each on a fresh copy of the synthetic state: interference from other work on the
machine only ever adds time, so the minimum is the estimate least disturbed by it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from lightspec_jax.pallas_kernels import use_pallas
from lightspec_jax.planner import CostTable
from lightspec_jax.planner.survival import non_decreasing, non_increasing

from .batch import SlotState
from .multihost import Lockstep
from .runner import ModelRunner
from .scheduler import spread_slots
from .sharding import to_host

_PLACEHOLDER_MS = 1e-3


@dataclasses.dataclass(frozen=True)
class CostProfile:
    target: CostTable  # decode step ms at depth 0 by rows B (the verify)
    draft: CostTable  # drafting's part that follows B, ms by B (nil, or the commit: see above)
    draft_depth_ms: dict[int, float]  # the draft step of depth d, ms by d
    depth: CostTable  # the same as a table keyed by depth d
    context_per_request: int
    num_slots: int

    def summary(self) -> dict:
        return {"verify_ms": {b: self.target.estimate(b) for b in self.target.rows},
                "draft_commit_ms": {b: self.draft.estimate(b) for b in self.draft.rows},
                "draft_depth_ms": self.draft_depth_ms,
                "context_per_request": self.context_per_request, "num_slots": self.num_slots}

    def to_json(self) -> dict:
        return {"target": self.target.to_json(), "draft": self.draft.to_json(),
                "depth": self.depth.to_json(), "profile": self.summary()}

    @classmethod
    def from_json(cls, data: dict) -> "CostProfile":
        summary = data.get("profile", {})
        depth = CostTable.from_json(data["depth"]) if "depth" in data else CostTable()
        return cls(target=CostTable.from_json(data["target"]),
                   draft=CostTable.from_json(data["draft"]),
                   draft_depth_ms={int(d): ms for d, ms in
                                   summary.get("draft_depth_ms", {}).items()},
                   depth=depth, context_per_request=summary.get("context_per_request", 0),
                   num_slots=summary.get("num_slots", 0))


# Bumped when the sweep measures differently, so tables from an older method are not reused
# (2: each depth timed interleaved with its depth-0 twin; 3: the floor step writes only the
# drafter's cache, and the commit forward is priced apart from the verify; 4: drafting is its
# own executable per depth, the verify step writes the drafter's cache at every depth; 5: the
# sweep waits for the draft step, not just the read-back; 6: steps timed back to back with
# full proposals, as serving runs them; 7: depth prices fitted non-decreasing; 8: the verify
# table imputes other contexts by the attention route, see verify_context_rule; 9: the CPU's
# reference attention reads 32-position blocks, pallas_kernels.verify_attention.reference_block,
# which cut its steps by up to a third: tables timed before it overprice every step; 10:
# data-parallel replicas verify their own B / D rows, and the sweep spreads its slots over them;
# 11: a drafter that catches up is priced without its commit at the floor buckets; 12: the
# online refresh keeps each context column's shape, planner.CostTable.update_level - a table
# refreshed cell by cell before it holds the shape its history drifted into, which the new
# refresh would keep for good, so it is swept again; 13: every bucket timed once per round,
# and the verify prices fitted non-decreasing in rows - a table swept bucket by bucket may
# hold a spell of the machine as a step between two buckets, kept for good by that refresh).
SWEEP_VERSION = 13


def cache_key(runner: ModelRunner, target, *, dtype: str, depths: tuple[int, ...],
              policy: str, version: str) -> str:
    """What the cost tables depend on, hashed: the models (configs and a fingerprint of their
    weights), dtype, slots, buckets, depths, cache length, device kind and library versions.
    Any change gives another key, so a stale table is never loaded."""
    import hashlib

    leaves = list(runner._t_leaves) + list(runner._d_leaves)
    # The first 8 values of every leaf, gathered in one small executable (not a full copy).
    head = jax.jit(lambda xs: jnp.stack([
        jnp.pad(x.reshape(-1)[:8].astype(jnp.float32), (0, max(0, 8 - x.size))) for x in xs]))
    fingerprint = hashlib.sha256(to_host(head(leaves)).tobytes()).hexdigest()
    drafter = runner.drafter
    parts = {
        "target": dataclasses.asdict(target.config), "fingerprint": fingerprint,
        "shapes": [list(x.shape) for x in leaves],
        "drafter": None if drafter is None else [type(drafter).__name__,
                                                  repr(getattr(drafter, "config", None))],
        "dtype": dtype, "slots": runner.num_slots, "cache_len": runner.cache_len,
        "row_tile": runner.row_tile,
        "mesh": None if runner.layout is None else dict(runner.layout.mesh.shape),
        "decode_buckets": runner.decode_registry.sizes, "depths": depths, "policy": policy,
        "floor_buckets": sorted(runner.floor_buckets),
        "verifier": [runner.verifier.name, type(runner.verifier).__name__,
                     runner.verifier.support, runner.verifier.coupled_support],
        "device": jax.devices()[0].device_kind,
        "backend": jax.default_backend(), "jax": jax.__version__, "lightspec_jax": version,
        "sweep": SWEEP_VERSION,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _synthetic_state(runner: ModelRunner, context: int, active: int) -> SlotState:
    n, k = runner.num_slots, runner.max_depth
    # Spread over the data-parallel replicas as the scheduler admits requests: each replica
    # verifies its own B / D rows.
    slots = jnp.asarray(spread_slots(n, runner.replicas, active))
    return runner.place_state(runner.empty_state()._replace(
        seq_len=jnp.full((n,), context, jnp.int32), active=slots,
        remaining=jnp.full((n,), 1 << 20, jnp.int32),
        draft_conf=jnp.full((n, k), 0.5, jnp.float32),
        proposal_len=jnp.full((n,), k, jnp.int32)))


def _time_rounds(runner: ModelRunner, work: list[tuple[int, tuple[tuple[int, bool], ...]]], *,
                 context: int, steps: int, repeats: int, progress=None) -> list[list[float]]:
    """Least ms per step of every (rows, variants) item of `work`: for each item, one figure
    per (depth, whether the drafter commits) variant.

    The sweep runs in rounds: a warm-up round of one step per variant, then `repeats` rounds,
    each timing every variant of every item once, so each figure is the fastest of `repeats`
    timings spread over the whole sweep. A slow spell of a shared machine then hits every
    bucket alike rather than the one being timed. Timed bucket by bucket, a spell became a
    step between two buckets, which the online refresh keeps (a HumanEval c = 4 table priced
    8 rows at 1.53x 6 rows, where the loop's periods differ by 1.13x), and the planner drafted
    around it (BENCHMARKS.md, "Forty-ninth session: the start-up sweep in rounds").
    progress: called once per timing (a tqdm's update), or None.
    """
    times = [[[] for _ in variants] for _, variants in work]
    for round_ in range(repeats + 1):
        count = 1 if round_ == 0 else steps  # the first round warms up
        for (rows, variants), timed in zip(work, times):
            for figure, ms in zip(timed, _time_round(runner, rows, variants, context=context,
                                                     count=count)):
                figure.append(ms)
                if progress is not None:
                    progress()
    return [[min(t[1:]) for t in timed] for timed in times]


def _time_round(runner: ModelRunner, rows: int, variants: tuple[tuple[int, bool], ...], *,
                context: int, count: int) -> list[float]:
    """ms per step of the decode step at `rows`, once for each (depth, commit) variant.

    Each timing dispatches `count` steps back to back and waits once, as the overlapped loop
    runs them: a step's dispatch and launch latency hide behind the step before it, so a
    bucket is priced at what it adds to a serving step, not at a lone step's round trip (on
    the H200 a lone verify at B = 256 timed 4.5 ms where back-to-back steps take 4.0). Before
    every step the proposals are re-armed to full length, so a bucket's rows are all real.
    The variants are timed in turn (a depth's price is the difference of two of them). What
    steps that do not commit leave the drafter behind by is dropped, not caught up: the
    synthetic state's drafter cache is read by nothing.
    """
    extra = runner.verifier.empty_inputs(runner.num_slots, runner.max_depth)
    out = []
    for depth, commit in variants:
        runner.state = _synthetic_state(runner, context, min(runner.num_slots, rows))
        runner.discard_catch_up()
        jax.block_until_ready(runner.state)
        start = time.perf_counter()
        for _ in range(count):
            # (placed again: jit leaves a zero-size field replicated on a mesh)
            runner.state = runner.place_state(_rearm(runner.state))
            readback, _ = runner.decode(rows, depth, extra, commit=commit)
        # The draft step ends after the read-back is ready: wait for the state it writes.
        jax.block_until_ready((readback, runner.state, runner.dcache))
        out.append(1e3 * (time.perf_counter() - start) / count)
    return out


@functools.partial(jax.jit, donate_argnums=0)
def _rearm(state: SlotState) -> SlotState:
    """Every active slot holds a full-length proposal again (the sweep's steady state)."""
    k = state.draft_tokens.shape[1]
    return state._replace(proposal_len=jnp.where(state.active, k, 0).astype(jnp.int32))


def profile_costs(runner: ModelRunner, *, depths: tuple[int, ...], context: int = 128,
                  steps: int = 4, repeats: int = 3, show_progress: bool = True) -> CostProfile:
    # Each timed step commits up to K + 1 tokens per slot and writes K more past them.
    k = runner.max_depth
    room = runner.cache_len - 2 * k - 2
    context = max(1, min(context, room // 2))
    steps = max(1, min(steps, (room - context) // (k + 1)))
    n = runner.num_slots
    sizes = runner.decode_registry.sizes
    home = runner.decode_registry.pick(n)  # the bucket of one row per slot
    depths = tuple(sorted(set(depths)))
    # A depth's price is a difference of two timings at the home bucket, so each is timed
    # interleaved with its own depth-0 twin; so is a floor bucket's recording step with its
    # committing one.
    work = ([(b, ((0, True), (0, False)) if b in runner.floor_buckets else ((0, True),))
             for b in sizes] + [(home, ((0, True), (d, True))) for d in depths])
    total = (repeats + 1) * sum(len(variants) for _, variants in work)
    with tqdm(total=total, desc="profiling decode buckets", disable=not show_progress,
              leave=False) as bar:
        timings = _time_rounds(runner, work, context=context, steps=steps, repeats=repeats,
                               progress=bar.update)
    ms, added, commit_ms = {}, {}, {}
    for (rows, pair), timed in zip(work, timings):
        (depth, commit) = pair[-1]
        if depth:
            added[depth] = timed[1] - timed[0]  # what the draft step of depth d adds
        else:
            ms[rows] = timed[-1]
            if not commit:
                commit_ms[rows] = timed[0] - timed[1]  # what the commit forward adds
    runner.state = runner.place_state(runner.empty_state())
    runner.discard_catch_up()
    # Drafting deeper never costs less, nor does drafting cost less than nothing: a depth
    # priced below a shallower one (each price is a difference of two timings) is timing
    # noise, which a non-decreasing least-squares fit removes - left in, it would make the
    # planner draft deeper for "free".
    fitted = -non_increasing(-np.array([added[d] for d in depths]), np.ones(len(depths)))
    depth_ms = {d: max(float(ms), _PLACEHOLDER_MS) for d, ms in zip(depths, fitted)}
    # Nor does verifying more rows: a bucket timed under a smaller one is noise too, and
    # left in, it would price a step in the table that the device does not have.
    verify_ms = dict(zip(sizes, non_decreasing([ms[b] for b in sizes])))
    total_context = n * context
    return CostProfile(target=CostTable(verify_ms, context_len=total_context,
                                        impute=verify_context_rule()),
                       draft=CostTable({b: max(commit_ms.get(b, 0.0), _PLACEHOLDER_MS)
                                        for b in sizes}, context_len=total_context),
                       draft_depth_ms=depth_ms,
                       # each depth re-reads the context: scale, not shift, across contexts
                       depth=CostTable(depth_ms, context_len=total_context, impute="scale"),
                       context_per_request=context, num_slots=n)


def verify_context_rule() -> str:
    """How the verify table carries what a context column measured to its unmeasured buckets.

    The GPU kernel reads each request's KV once per step, whatever its rows, so a longer
    context adds about the same time to every bucket ("shift"). The jnp reference the CPU runs
    reads it once per row, so a longer context multiplies a bucket's time ("scale"). A shift on
    the CPU biased the planner toward speculating at high concurrency: serving measures the
    large speculative buckets at contexts longer than the sweep's, and their added
    milliseconds, shifted as they are onto the one-row-per-request bucket, overpriced the
    floor."""
    return "shift" if use_pallas(op="verify_attention") else "scale"


class CostStore:
    """Where an engine's cost tables live between starts: `cost_table_path` when given, else
    a file in the cost cache named by `cache_key` (None: nowhere, sweep every start)."""

    def __init__(self, path: str | None):
        self.path = path

    @classmethod
    def for_engine(cls, config, runner: ModelRunner, target, *, depths: tuple[int, ...],
                   policy: str) -> "CostStore":
        path = config.cost_table_path
        if path is None and config.resolved_cost_cache_dir is not None:
            from lightspec_jax import __version__

            key = cache_key(runner, target, dtype=str(target.dtype), depths=depths,
                            policy=policy, version=__version__)
            path = os.path.join(config.resolved_cost_cache_dir, f"{key}.json")
        return cls(path)

    def load_or_sweep(self, runner: ModelRunner, *, depths: tuple[int, ...],
                      show_progress: bool, lockstep: Lockstep | None = None) -> CostProfile:
        """The stored tables, or the bucket sweep's (stored for the next start).

        Over several processes (`lockstep`) process 0's store decides: every process sweeps
        when it has no table (the sweep's steps are collectives), and every process gets
        process 0's tables; only process 0 writes the store."""
        leads = lockstep is None or lockstep.leads
        profile = self._load(show_progress) if leads else None
        sweep = profile is None if lockstep is None else lockstep.flag(profile is None)
        if sweep:
            profile = profile_costs(runner, depths=depths, show_progress=show_progress)
            if leads:
                self.save(profile)
        if lockstep is not None:
            profile = CostProfile.from_json(lockstep.profile_json(
                profile.to_json() if leads else None))
        return profile

    def _load(self, show_progress: bool) -> CostProfile | None:
        if not (self.path and os.path.isfile(self.path)):
            return None
        with open(self.path) as f:
            profile = CostProfile.from_json(json.load(f))
        if show_progress:
            print(f"lightspec_jax: cost tables from {self.path}")
        return profile

    def save(self, profile: CostProfile) -> None:
        if not self.path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(profile.to_json(), f, indent=1)
        os.replace(tmp, self.path)  # atomic: a concurrent start never reads half a file


def device_interval_ms(*, previous_ready: float | None, previous_waited: bool,
                       busy_at_enqueue: bool, waited: bool, ready: float) -> float | None:
    """Device time of one decode step from host timestamps, or None when it is unknown.

    A step's read-back is ready when its verify executable ends. Between two reads the device
    ran one step's worth of work (the previous step's drafting and this verify) - but only if
    it never idled in between, which the host can tell without syncing: it waited for both
    reads (the device was busy at each ready time) and, when it enqueued this step, the
    previous one was not finished (no gap). A host-bound loop
    (the device done before the host asks) gives no sample: its intervals time host work,
    which says nothing about a bucket's cost.
    """
    if previous_ready is None or not (previous_waited and busy_at_enqueue and waited):
        return None
    return 1e3 * (ready - previous_ready)
