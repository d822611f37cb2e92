"""commit: apply one step's verified tokens to the slots.

After ``verify`` a stepped slot (active, with a verify row) has num_new = accepted + 1 target
tokens. The KV of last_token and the accepted drafts is now valid, so seq_len grows by
accepted + 1 and the bonus token becomes the new last_token; KV written for rejected rows lies
beyond seq_len and is overwritten next step (reference/lightspec-algorithm.md §8). What the
request may emit is cut at its first stop id (inclusive) and at its remaining token allowance.
The verify row of the bonus token, row_start + accepted, is where the drafter continues from;
commit returns its index (the drafter reads that row's hidden state itself).

Axis legend: N slots, K max draft depth (K+1 <= 16), B verify rows, S stop ids per slot.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from ._backend import (
    MAX_WIDTH,
    SLOT_BLOCK_TUNING,
    Impl,
    interpreted,
    on_local_shards,
    pow2_at_least,
    use_pallas,
)
from .fill import FillResult

_SLOTS_PER_BLOCK = 32


class CommitResult(NamedTuple):
    """Per-slot outcome of one step.

    num_emitted:    i32[N] tokens to stream: num_new cut at the first stop id and at remaining.
    finished:       bool[N] the slot hit a stop id or used up its remaining tokens this step.
    new_seq_len:    i32[N] seq_len + accepted + 1 for stepped slots, unchanged otherwise.
    new_last_token: i32[N] the bonus token; -1 for slots that did not step.
    tail_row:       i32[N] row_start + accepted, the verify row the next proposal starts from.
    """

    num_emitted: jax.Array
    finished: jax.Array
    new_seq_len: jax.Array
    new_last_token: jax.Array
    tail_row: jax.Array


def _check_commit_args(
    out_tokens, num_new, accepted, fill, seq_len, active, stop_ids, remaining
) -> None:
    if out_tokens.ndim != 2 or not 2 <= out_tokens.shape[1] <= MAX_WIDTH:
        raise ValueError(
            f"out_tokens must be [N, K+1] with 2 <= K+1 <= {MAX_WIDTH}, got {out_tokens.shape}"
        )
    n = out_tokens.shape[0]
    per_slot = dict(
        num_new=num_new,
        accepted=accepted,
        seq_len=seq_len,
        active=active,
        remaining=remaining,
        **{f"fill.{f}": getattr(fill, f) for f in ("lengths", "row_start", "slot_valid")},
    )
    for name, x in per_slot.items():
        if x.shape != (n,):
            raise ValueError(
                f"{name} {x.shape} must be ({n},) to match out_tokens {out_tokens.shape}"
            )
    if stop_ids.ndim != 2 or stop_ids.shape[0] != n:
        raise ValueError(f"stop_ids must be [N={n}, S], got {stop_ids.shape}")


def commit_reference(
    out_tokens: jax.Array,
    num_new: jax.Array,
    accepted: jax.Array,
    fill: FillResult,
    seq_len: jax.Array,
    active: jax.Array,
    stop_ids: jax.Array,
    remaining: jax.Array,
) -> CommitResult:
    """Plain-jnp commit: stop matching by broadcasting against all stop ids."""
    out_tokens, num_new, accepted, seq_len, active, stop_ids, remaining = map(
        jnp.asarray, (out_tokens, num_new, accepted, seq_len, active, stop_ids, remaining)
    )
    fill = FillResult(*map(jnp.asarray, fill))
    _check_commit_args(out_tokens, num_new, accepted, fill, seq_len, active, stop_ids, remaining)
    n, width = out_tokens.shape
    stepped = active.astype(bool) & fill.slot_valid  # [N]
    offset = jnp.arange(width, dtype=jnp.int32)  # [K+1]
    new = offset[None, :] < num_new[:, None]  # [N, K+1]
    is_stop = (out_tokens[:, :, None] == stop_ids[:, None, :]) & (stop_ids[:, None, :] >= 0)
    stop_at = new & is_stop.any(axis=2)  # [N, K+1]
    # argmax finds the first True; rows without a stop get the full width.
    first_stop = jnp.where(stop_at.any(axis=1), jnp.argmax(stop_at, axis=1), width)
    emitted = jnp.minimum(jnp.minimum(num_new, first_stop + 1), jnp.maximum(remaining, 0))
    emitted = jnp.where(stepped, emitted, 0).astype(jnp.int32)
    finished = stepped & ((first_stop < emitted) | (emitted >= remaining))

    bonus = jnp.take_along_axis(out_tokens, accepted[:, None], axis=1)[:, 0]
    return CommitResult(
        num_emitted=emitted,
        finished=finished,
        new_seq_len=jnp.where(stepped, seq_len + accepted + 1, seq_len).astype(jnp.int32),
        new_last_token=jnp.where(stepped, bonus, -1).astype(jnp.int32),
        tail_row=(fill.row_start + accepted).astype(jnp.int32),
    )


def _commit_tokens_kernel(
    out_tokens_ref,  # i32[SB, 16]
    stop_ids_ref,  # i32[SB, Sp], -1 padded
    num_new_ref,  # i32[SB]
    accepted_ref,  # i32[SB]
    row_start_ref,  # i32[SB]
    stepped_ref,  # i32[SB]
    seq_len_ref,  # i32[SB]
    remaining_ref,  # i32[SB]
    num_emitted_ref,  # out i32[SB]
    finished_ref,  # out i32[SB]
    new_seq_len_ref,  # out i32[SB]
    new_last_token_ref,  # out i32[SB]
    tail_row_ref,  # out i32[SB]
):
    slots, width = out_tokens_ref.shape
    offset = lax.broadcasted_iota(jnp.int32, (slots, width), 1)  # [SB, 16]
    tokens = out_tokens_ref[...]
    num_new = num_new_ref[...]
    accepted = accepted_ref[...]
    remaining = remaining_ref[...]
    stepped = stepped_ref[...] != 0

    # Column loop over stop ids (S is small): one [SB, 16] compare each, no 3-D tile.
    is_stop = jnp.zeros((slots, width), jnp.bool_)
    for s in range(stop_ids_ref.shape[1]):
        stop = stop_ids_ref[:, s][:, None]  # [SB, 1]
        is_stop = is_stop | ((tokens == stop) & (stop >= 0))
    stop_at = is_stop & (offset < num_new[:, None])
    first_stop = jnp.min(jnp.where(stop_at, offset, width), axis=1)  # [SB]; width = none

    emitted = jnp.minimum(jnp.minimum(num_new, first_stop + 1), jnp.maximum(remaining, 0))
    emitted = jnp.where(stepped, emitted, 0)
    num_emitted_ref[...] = emitted
    finished = stepped & ((first_stop < emitted) | (emitted >= remaining))
    finished_ref[...] = finished.astype(jnp.int32)
    new_seq_len_ref[...] = jnp.where(stepped, seq_len_ref[...] + accepted + 1, seq_len_ref[...])
    # Exactly one column equals `accepted`, so the masked sum picks the bonus token.
    bonus = jnp.sum(jnp.where(offset == accepted[:, None], tokens, 0), axis=1)
    new_last_token_ref[...] = jnp.where(stepped, bonus, -1)
    tail_row_ref[...] = row_start_ref[...] + accepted


@functools.partial(jax.jit, static_argnames=("impl", "interpret"))
def commit(
    out_tokens: jax.Array,
    num_new: jax.Array,
    accepted: jax.Array,
    fill: FillResult,
    seq_len: jax.Array,
    active: jax.Array,
    stop_ids: jax.Array,
    remaining: jax.Array,
    *,
    impl: Impl = None,
    interpret: bool = False,
) -> CommitResult:
    """Commit one verified step.

    Args:
      out_tokens: i32[N, K+1], num_new: i32[N], accepted: i32[N] from ``verify``.
      fill: the step's ``FillResult``; a slot steps only if ``active`` and ``fill.slot_valid``.
      seq_len: i32[N] committed tokens whose KV is in the cache.
      active: bool[N] slots in this step.
      stop_ids: i32[N, S] EOS and stop ids per request, -1 padded.
      remaining: i32[N] tokens the request may still emit
        (min(max_tokens - generated, max_model_len - current length)).
    """
    _check_commit_args(out_tokens, num_new, accepted, fill, seq_len, active, stop_ids, remaining)
    if not use_pallas(impl, interpret=interpret, op="commit"):
        return commit_reference(
            out_tokens, num_new, accepted, fill, seq_len, active, stop_ids, remaining
        )
    kernel = functools.partial(_commit_pallas, interpret=interpreted(impl, interpret))
    return on_local_shards(kernel, (P(),) * 8, P())(
        out_tokens, num_new, accepted, fill, seq_len, active, stop_ids, remaining)


def _commit_pallas(out_tokens, num_new, accepted, fill, seq_len, active, stop_ids, remaining,
                   *, interpret: bool) -> CommitResult:
    """The kernel's route of ``commit``: slots padded to blocks of _SLOTS_PER_BLOCK."""
    n, width = out_tokens.shape
    n_pad = pow2_at_least(n)
    s_pad = pow2_at_least(stop_ids.shape[1], minimum=1)
    block = min(n_pad, _SLOTS_PER_BLOCK)
    stepped = active.astype(bool) & fill.slot_valid

    def pad_slots(x):  # [N] -> [Np]; padded slots do not step
        return jnp.zeros((n_pad,), jnp.int32).at[:n].set(x.astype(jnp.int32))

    tokens = jnp.full((n_pad, MAX_WIDTH), -1, jnp.int32).at[:n, :width].set(
        out_tokens.astype(jnp.int32)
    )
    stops = jnp.full((n_pad, s_pad), -1, jnp.int32).at[:n, : stop_ids.shape[1]].set(
        stop_ids.astype(jnp.int32)
    )

    per_slot = pl.BlockSpec((block,), lambda s: (s,))
    slot_out = jax.ShapeDtypeStruct((n_pad,), jnp.int32)
    num_emitted, finished, new_seq_len, new_last_token, tail_row = pl.pallas_call(
        _commit_tokens_kernel,
        grid=(n_pad // block,),
        in_specs=[
            pl.BlockSpec((block, MAX_WIDTH), lambda s: (s, 0)),
            pl.BlockSpec((block, s_pad), lambda s: (s, 0)),
            *[per_slot] * 6,
        ],
        out_specs=[per_slot] * 5,
        out_shape=[slot_out] * 5,
        compiler_params=SLOT_BLOCK_TUNING.compiler_params(),
        interpret=interpret,
        name="lightspec_commit_tokens",
    )(
        tokens,
        stops,
        pad_slots(num_new),
        pad_slots(accepted),
        pad_slots(fill.row_start),
        pad_slots(stepped),
        pad_slots(seq_len),
        pad_slots(remaining),
    )

    return CommitResult(
        num_emitted=num_emitted[:n],
        finished=finished[:n] != 0,
        new_seq_len=new_seq_len[:n],
        new_last_token=new_last_token[:n],
        tail_row=tail_row[:n],
    )
