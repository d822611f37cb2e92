"""verify: exact-match acceptance of each slot's drafts against the target's own tokens.

Row j of slot i (``fill`` layout) feeds the target draft j-1 (or last_token for j = 0), so the
target's token there, t[i, j] = target_tokens[row_start[i] + j], is what the target itself would
emit after draft j-1. Draft j is accepted while t[i, j] == draft_tokens[i, j]; the first target
token that differs, or the one after the last verified draft, is the bonus token. Committing
target tokens only is what makes this lossless (reference/lightspec-algorithm.md §8, §12).

Axis legend: N slots, K max draft depth (K+1 <= 16), B verify rows.
"""

from __future__ import annotations

import functools

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

# Slots per program: a [32, 16] tile per program, many programs at N = 256.
_SLOTS_PER_BLOCK = 32


def _check_verify_args(target_tokens, fill: FillResult, draft_tokens) -> None:
    if draft_tokens.ndim != 2 or draft_tokens.shape[1] + 1 > MAX_WIDTH:
        raise ValueError(
            f"draft_tokens must be [N, K] with K <= {MAX_WIDTH - 1}, got {draft_tokens.shape}"
        )
    n = draft_tokens.shape[0]
    b = fill.row_slot.shape
    if target_tokens.shape != b:
        raise ValueError(
            f"target_tokens {target_tokens.shape} must have one token per verify row {b}"
        )
    for name in ("lengths", "row_start", "slot_valid"):
        if getattr(fill, name).shape != (n,):
            raise ValueError(
                f"fill.{name} {getattr(fill, name).shape} must be ({n},) "
                f"to match draft_tokens {draft_tokens.shape}"
            )


def verify_reference(
    target_tokens: jax.Array, fill: FillResult, draft_tokens: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Plain-jnp verify: gather each slot's target tokens, cumprod of matches."""
    target_tokens, draft_tokens = jnp.asarray(target_tokens), jnp.asarray(draft_tokens)
    fill = FillResult(*map(jnp.asarray, fill))
    _check_verify_args(target_tokens, fill, draft_tokens)
    n, k = draft_tokens.shape
    offset = jnp.arange(k + 1, dtype=jnp.int32)  # [K+1]
    rows = fill.row_start[:, None] + offset[None, :]  # [N, K+1]
    in_slot = fill.slot_valid[:, None] & (offset[None, :] <= fill.lengths[:, None])
    target = jnp.where(in_slot, target_tokens.at[rows].get(mode="fill", fill_value=-1), -1)

    verified = offset[None, :k] < fill.lengths[:, None]  # [N, K] drafts that had a row
    match = verified & (target[:, :k] == draft_tokens)
    accepted = jnp.cumprod(match, axis=1).sum(axis=1, dtype=jnp.int32)  # [N]
    out_tokens = jnp.where(offset[None, :] <= accepted[:, None], target, -1)  # [N, K+1]
    num_new = jnp.where(fill.slot_valid, accepted + 1, 0)
    return accepted, out_tokens, num_new


def _verify_kernel(
    target_ref,  # i32[Bp], all rows (gathered by index)
    row_start_ref,  # i32[SB]
    lengths_ref,  # i32[SB]
    slot_valid_ref,  # i32[SB]
    draft_ref,  # i32[SB, 16]; column j is compared with the target token at offset j
    accepted_ref,  # out i32[SB]
    out_tokens_ref,  # out i32[SB, 16]
    num_new_ref,  # out i32[SB]
):
    slots, width = draft_ref.shape
    last_row = target_ref.shape[0] - 1
    offset = lax.broadcasted_iota(jnp.int32, (slots, width), 1)  # [SB, 16]
    lengths = lengths_ref[...][:, None]  # [SB, 1]
    slot_valid = slot_valid_ref[...] != 0  # [SB]
    # Slots without rows point at the end of the used rows; clamp so the gather stays in bounds.
    rows = jnp.minimum(row_start_ref[...][:, None] + offset, last_row)
    in_slot = slot_valid[:, None] & (offset <= lengths)
    target = jnp.where(in_slot, target_ref[rows], -1)  # [SB, 16]

    # Accepted = drafts before the first miss; offset == lengths counts as a miss.
    miss = ((offset >= lengths) | (target != draft_ref[...])).astype(jnp.int32)
    accepted = jnp.sum((jnp.cumsum(miss, axis=1) == 0).astype(jnp.int32), axis=1)  # [SB]
    accepted_ref[...] = accepted
    out_tokens_ref[...] = jnp.where(offset <= accepted[:, None], target, -1)
    num_new_ref[...] = jnp.where(slot_valid, accepted + 1, 0)


@functools.partial(jax.jit, static_argnames=("impl", "interpret"))
def verify(
    target_tokens: jax.Array,
    fill: FillResult,
    draft_tokens: jax.Array,
    *,
    impl: Impl = None,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Exact-match verification.

    Args:
      target_tokens: i32[B] the target's token (argmax or sample) at each verify row.
      fill: the ``FillResult`` that laid out these rows.
      draft_tokens: i32[N, K] the proposals the rows were built from.

    Returns:
      accepted: i32[N] longest prefix j < lengths with target == draft (0 for slots without rows).
      out_tokens: i32[N, K+1] target tokens t[i, 0..accepted] (the last is the bonus), -1 beyond.
      num_new: i32[N] accepted + 1 for slots with rows, 0 otherwise.
    """
    _check_verify_args(target_tokens, fill, draft_tokens)
    if not use_pallas(impl, interpret=interpret, op="verify"):
        return verify_reference(target_tokens, fill, draft_tokens)
    kernel = functools.partial(_verify_pallas, interpret=interpreted(impl, interpret))
    return on_local_shards(kernel, (P(),) * 3, P())(target_tokens, fill, draft_tokens)


def _verify_pallas(target_tokens, fill, draft_tokens, *, interpret: bool):
    """The kernel's route of ``verify``: slots padded to blocks of _SLOTS_PER_BLOCK."""
    n, k = draft_tokens.shape
    b = target_tokens.shape[0]
    n_pad, b_pad = pow2_at_least(n), pow2_at_least(b)
    block = min(n_pad, _SLOTS_PER_BLOCK)

    def pad_slots(x):  # [N] -> [Np]; padded slots have no rows
        return jnp.zeros((n_pad,), jnp.int32).at[:n].set(x.astype(jnp.int32))

    target = jnp.zeros((b_pad,), jnp.int32).at[:b].set(target_tokens.astype(jnp.int32))
    # Columns >= K never match: offset >= lengths already counts as a miss there.
    draft = jnp.full((n_pad, MAX_WIDTH), -1, jnp.int32)
    draft = draft.at[:n, :k].set(draft_tokens.astype(jnp.int32))  # [Np, 16]

    per_slot = pl.BlockSpec((block,), lambda s: (s,))
    per_slot_row = pl.BlockSpec((block, MAX_WIDTH), lambda s: (s, 0))
    accepted, out_tokens, num_new = pl.pallas_call(
        _verify_kernel,
        grid=(n_pad // block,),
        in_specs=[
            pl.BlockSpec((b_pad,), lambda s: (0,)),
            per_slot,
            per_slot,
            per_slot,
            per_slot_row,
        ],
        out_specs=[per_slot, per_slot_row, per_slot],
        out_shape=[
            jax.ShapeDtypeStruct((n_pad,), jnp.int32),
            jax.ShapeDtypeStruct((n_pad, MAX_WIDTH), jnp.int32),
            jax.ShapeDtypeStruct((n_pad,), jnp.int32),
        ],
        compiler_params=SLOT_BLOCK_TUNING.compiler_params(),
        interpret=interpret,
        name="lightspec_verify",
    )(target, pad_slots(fill.row_start), pad_slots(fill.lengths), pad_slots(fill.slot_valid), draft)
    return accepted[:n], out_tokens[:n, : k + 1], num_new[:n]
