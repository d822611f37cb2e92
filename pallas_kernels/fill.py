"""fill: choose which draft tokens the target verifies this step, and lay out the verify rows.

LightSpec's "budget-then-fill" (reference/lightspec-algorithm.md §7): the host picks the number
of verify rows B; the device picks which rows. Each active slot i scores its rows

    score[i, 0] = always kept (the target row, carrying last_token)
    score[i, j] = prod_{m <= j} clamp(conf[i, m-1], 0.01, 0.99)     1 <= j <= proposal_len[i]

and the global top-B scores are verified. The clamp makes survival strictly decreasing within a
slot, so each slot's selection is a prefix and ``lengths = selected - 1``. Ties across slots go
to the lower flat index i*(K+1)+j, so the selection is deterministic. A prefix sum then packs the
rows, ordered by (slot, offset), into a flat [B] layout with no host sync.

This is the device form of a rule stated once, in numpy, in planner/fill.py (which the
simulator, the DSpark-style planner and the diagnostics call on the host);
tests/pallas_kernels/test_fill.py checks `fill_reference` and the kernel against it.

Axis legend: N slots, K max draft depth (K+1 <= 16), B verify rows.
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from ._backend import (
    FILL_TUNING,
    LAYOUT_TUNING,
    MAX_WIDTH,
    Impl,
    interpreted,
    on_local_shards,
    pow2_at_least,
    use_pallas,
)

_CONF_MIN = 0.01
_CONF_MAX = 0.99
# Above every survival (<= 0.99): target rows win any budget.
_TARGET_SCORE = 2.0
# Elements of one program's [rows, slots] comparison tile in the row layout.
_LAYOUT_TILE_ELEMS = 8192


class FillResult(NamedTuple):
    """The verify-row layout of one step. Rows of slot i: row_start[i] .. row_start[i]+lengths[i].

    lengths:    i32[N] drafts verified per slot; 0 <= lengths <= proposal_len; 0 if no row.
    row_start:  i32[N] first row of the slot; for slots without rows, the number of used rows.
    slot_valid: bool[N] the slot has its target row in this batch (active, within budget).
    row_slot:   i32[B] owning slot; N (out of range, so scatters drop it) on padding rows.
    row_offset: i32[B] 0 = target row (last_token), j >= 1 = draft_tokens[slot, j-1]; 0 on padding.
    row_valid:  bool[B] False on padding rows.
    """

    lengths: jax.Array
    row_start: jax.Array
    slot_valid: jax.Array
    row_slot: jax.Array
    row_offset: jax.Array
    row_valid: jax.Array


def _clamp_confidence(conf: jax.Array) -> jax.Array:
    # A NaN confidence (a broken drafter row) counts as the minimum instead of outranking
    # everything: clip would keep NaN, and NaN bits compare above every real score.
    return jnp.clip(jnp.where(jnp.isnan(conf), 0.0, conf), _CONF_MIN, _CONF_MAX)


def _check_fill_args(confidences, proposal_len, active, num_rows) -> None:
    if confidences.ndim != 2:
        raise ValueError(f"confidences must be [N, K], got shape {confidences.shape}")
    n, k = confidences.shape
    if n < 1 or k < 1 or k + 1 > MAX_WIDTH:
        raise ValueError(
            f"confidences [N, K] = {confidences.shape} needs N >= 1 and 1 <= K <= {MAX_WIDTH - 1}"
        )
    if proposal_len.shape != (n,) or active.shape != (n,):
        raise ValueError(
            f"proposal_len {proposal_len.shape} and active {active.shape} must both be ({n},) "
            f"to match confidences {confidences.shape}"
        )
    if isinstance(num_rows, bool) or not isinstance(num_rows, numbers.Integral) or num_rows < 1:
        raise ValueError(f"num_rows must be a static int >= 1, got {num_rows!r}")


def fill_reference(
    confidences: jax.Array, proposal_len: jax.Array, active: jax.Array, *, num_rows: int
) -> FillResult:
    """Plain-jnp fill: lax.top_k over the flat scores, then a searchsorted row layout."""
    confidences, proposal_len, active = map(jnp.asarray, (confidences, proposal_len, active))
    _check_fill_args(confidences, proposal_len, active, num_rows)
    num_rows = int(num_rows)  # a numpy integer from a bucket table is fine too
    n, k = confidences.shape
    conf = _clamp_confidence(confidences.astype(jnp.float32))  # [N, K]
    plen = jnp.clip(proposal_len.astype(jnp.int32), 0, k)  # [N]
    active = active.astype(bool)

    # Left fold, the same multiplication order as the kernel, so scores match bit for bit.
    survival = [jnp.ones((n,), jnp.float32)]
    for m in range(k):
        survival.append(survival[-1] * conf[:, m])
    score = jnp.stack(survival, axis=1)  # [N, K+1]
    offset = jnp.arange(k + 1, dtype=jnp.int32)  # [K+1]
    candidate = active[:, None] & (offset[None, :] <= plen[:, None])  # [N, K+1]
    score = jnp.where(offset[None, :] == 0, _TARGET_SCORE, score)
    score = jnp.where(candidate, score, -1.0)

    # lax.top_k documents that the lower index comes first among equal values: our tie rule on
    # the flat index i*(K+1)+j.
    flat = score.reshape(-1)  # [N*(K+1)]
    _, top = lax.top_k(flat, min(num_rows, flat.size))
    chosen = jnp.zeros(flat.shape, bool).at[top].set(True).reshape(n, k + 1) & candidate

    counts = chosen.sum(axis=1, dtype=jnp.int32)  # [N] rows per slot
    ends = jnp.cumsum(counts)  # [N]
    starts = ends - counts
    total = ends[-1]
    slot_valid = counts > 0

    row = jnp.arange(num_rows, dtype=jnp.int32)  # [B]
    row_valid = row < total
    row_slot = jnp.searchsorted(ends, row, side="right").astype(jnp.int32)  # N past the end
    row_offset = row - starts[jnp.minimum(row_slot, n - 1)]
    return FillResult(
        lengths=jnp.maximum(counts - 1, 0),
        row_start=jnp.where(slot_valid, starts, total),
        slot_valid=slot_valid,
        row_slot=jnp.where(row_valid, row_slot, n),
        row_offset=jnp.where(row_valid, row_offset, 0),
        row_valid=row_valid,
    )


def _total(x: jax.Array) -> jax.Array:
    """Sum of a 2-D tile, one axis at a time: jax 0.11's Triton lowering of a two-axis
    reduction builds a 1-D intermediate with the 2-D operand's sharding and fails under a mesh
    (seen in the CUDA-lowering test under an abstract H200 mesh)."""
    return jnp.sum(jnp.sum(x, axis=1), axis=0)


def _select_kernel(
    conf_ref,  # f32[Np, 16]; column j >= 1 holds conf[:, j-1]
    plen_ref,  # i32[Np] clipped to [0, K]
    active_ref,  # i32[Np]
    lengths_ref,  # out i32[Np]
    row_start_ref,  # out i32[Np]
    slot_valid_ref,  # out i32[Np]
    ends_ref,  # out i32[Np] inclusive prefix sum of rows per slot
    *,
    num_rows: int,
):
    n_pad, width = conf_ref.shape
    offset = lax.broadcasted_iota(jnp.int32, (n_pad, width), 1)  # [Np, 16]

    # Survival as a left fold over columns (Triton has no cumprod): column m multiplies into
    # every column j >= m.
    survival = jnp.ones((n_pad, width), jnp.float32)
    for m in range(1, width):
        c_m = _clamp_confidence(conf_ref[:, m])  # [Np]
        survival = survival * jnp.where(offset >= m, c_m[:, None], 1.0)
    candidate = (active_ref[...] != 0)[:, None] & (offset <= plen_ref[...][:, None])
    score = jnp.where(offset == 0, _TARGET_SCORE, survival)
    # Positive floats order like their bit patterns, so the threshold search runs on int32 keys.
    key = jnp.where(candidate, lax.bitcast_convert_type(score, jnp.int32), -1)  # [Np, 16]

    # Threshold = the B-th largest key: the largest t with #{key >= t} >= B, built bit by bit
    # from the top. With fewer than B candidates it stays 0 and every candidate is kept.
    def add_bit(i, threshold):
        trial = threshold | jnp.left_shift(jnp.int32(1), 30 - i)
        enough = _total((key >= trial).astype(jnp.int32)) >= num_rows
        return jnp.where(enough, trial, threshold)

    threshold = lax.fori_loop(0, 31, add_bit, jnp.int32(0))
    above = key > threshold
    # Keys equal to the threshold fill the remaining budget in flat (slot, offset) order.
    tie = (key == threshold).astype(jnp.int32)  # [Np, 16]; candidate keys are >= 0 > -1
    tie_in_slot = jnp.sum(tie, axis=1)  # [Np]
    tie_rank = (jnp.cumsum(tie_in_slot) - tie_in_slot)[:, None] + jnp.cumsum(tie, axis=1) - tie
    budget_left = num_rows - _total(above.astype(jnp.int32))
    chosen = above | ((tie != 0) & (tie_rank < budget_left))  # [Np, 16]

    counts = jnp.sum(chosen.astype(jnp.int32), axis=1)  # [Np]
    ends = jnp.cumsum(counts)  # [Np]
    lengths_ref[...] = jnp.maximum(counts - 1, 0)
    row_start_ref[...] = jnp.where(counts > 0, ends - counts, jnp.sum(counts))
    slot_valid_ref[...] = (counts > 0).astype(jnp.int32)
    ends_ref[...] = ends


def _layout_kernel(
    ends_ref,  # i32[Np] all slots' row ends
    row_slot_ref,  # out i32[R]
    row_offset_ref,  # out i32[R]
    row_valid_ref,  # out i32[R]
    *,
    num_slots: int,
):
    # Row r belongs to the first slot whose end exceeds r: its index is #{ends <= r} and its
    # start is the largest end <= r. One [R, Np] comparison tile per program.
    rows_per_tile = row_slot_ref.shape[0]
    ends = ends_ref[...]  # [Np]
    row = pl.program_id(0) * rows_per_tile + lax.broadcasted_iota(jnp.int32, (rows_per_tile,), 0)
    ended = ends[None, :] <= row[:, None]  # [R, Np]
    slot = jnp.sum(ended.astype(jnp.int32), axis=1)  # [R]
    start = jnp.max(jnp.where(ended, ends[None, :], 0), axis=1)  # [R]
    valid = row < jnp.max(ends)  # the last end is the number of used rows
    row_slot_ref[...] = jnp.where(valid, slot, num_slots)
    row_offset_ref[...] = jnp.where(valid, row - start, 0)
    row_valid_ref[...] = valid.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("num_rows", "impl", "interpret"))
def fill(
    confidences: jax.Array,
    proposal_len: jax.Array,
    active: jax.Array,
    *,
    num_rows: int,
    impl: Impl = None,
    interpret: bool = False,
) -> FillResult:
    """Top-B fill of the verify rows (LightSpec §7).

    Args:
      confidences: f32[N, K] drafter top-1 probability per proposal position.
      proposal_len: i32[N] proposal depth per slot (clipped to [0, K]).
      active: bool[N] slots that take part in this step.
      num_rows: B, the static verify-row bucket.

    Precondition: B >= number of active slots, so every active slot gets its target row. If it
    is violated, the first B active slots (by index) get a target row and the rest get none
    (``slot_valid`` False, no drafts verified).
    """
    _check_fill_args(confidences, proposal_len, active, num_rows)
    if not use_pallas(impl, interpret=interpret, op="fill"):
        return fill_reference(confidences, proposal_len, active, num_rows=num_rows)
    kernel = functools.partial(_fill_pallas, num_rows=int(num_rows),
                               interpret=interpreted(impl, interpret))
    return on_local_shards(kernel, (P(),) * 3, P())(confidences, proposal_len, active)


def _fill_pallas(confidences, proposal_len, active, *, num_rows: int, interpret: bool
                 ) -> FillResult:
    """The kernels' route of ``fill``: padded inputs, the selection, the row layout."""
    n, k = confidences.shape
    n_pad, b_pad = pow2_at_least(n), pow2_at_least(num_rows)
    conf = jnp.zeros((n_pad, MAX_WIDTH), jnp.float32)
    conf = conf.at[:n, 1 : k + 1].set(confidences.astype(jnp.float32))  # [Np, 16]
    plen = jnp.zeros((n_pad,), jnp.int32).at[:n].set(jnp.clip(proposal_len, 0, k))
    act = jnp.zeros((n_pad,), jnp.int32).at[:n].set(active.astype(jnp.int32))

    slot_out = jax.ShapeDtypeStruct((n_pad,), jnp.int32)
    lengths, row_start, slot_valid, ends = pl.pallas_call(
        functools.partial(_select_kernel, num_rows=num_rows),
        out_shape=(slot_out,) * 4,
        compiler_params=FILL_TUNING.compiler_params(),
        interpret=interpret,
        name="lightspec_fill_select",
    )(conf, plen, act)

    # The row layout is independent per row: spread it over programs instead of looping.
    tile = min(b_pad, max(1, _LAYOUT_TILE_ELEMS // n_pad))
    row_tile = pl.BlockSpec((tile,), lambda t: (t,))
    row_out = jax.ShapeDtypeStruct((b_pad,), jnp.int32)
    row_slot, row_offset, row_valid = pl.pallas_call(
        functools.partial(_layout_kernel, num_slots=n),
        grid=(b_pad // tile,),
        in_specs=[pl.BlockSpec((n_pad,), lambda t: (0,))],
        out_specs=(row_tile,) * 3,
        out_shape=(row_out,) * 3,
        compiler_params=LAYOUT_TUNING.compiler_params(),
        interpret=interpret,
        name="lightspec_fill_layout",
    )(ends)
    return FillResult(
        lengths=lengths[:n],
        row_start=row_start[:n],
        slot_valid=slot_valid[:n] != 0,
        row_slot=row_slot[:num_rows],
        row_offset=row_offset[:num_rows],
        row_valid=row_valid[:num_rows] != 0,
    )
