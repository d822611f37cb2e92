"""The verify-attention kernels' row layout, shared by the Triton and the Mosaic GPU kernel.

Rows are ordered by (slot, offset), so each request's rows are contiguous. They are cut into
*chunks*, runs of at most R rows of one slot; one program per (chunk, KV head) reads that
slot's KV once for all of the chunk's rows and all Q/G query heads of the KV head. The query
heads of one KV head sit row-major over (row, head) in a [G, (T+R) * Qp, D] array, so a chunk's
queries are one contiguous [R * Qp, D] tile starting at row start * Qp.

Axis legend: T rows, N slots, S cache length, G KV heads, Q query heads, D head dim, C chunks,
R rows per chunk, Qp = Q/G padded to a power of two.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ._backend import pow2_at_least


class RowChunks(NamedTuple):
    """i32[C] each: first row, rows (0: unused chunk), slot, largest position of its rows.

    Unused chunks have rows = 0 (their program does nothing) and start = T, which the padded
    query/output arrays keep in bounds.
    """

    start: jax.Array
    rows: jax.Array
    slot: jax.Array
    max_pos: jax.Array


def rows_per_chunk(num_rows: int, num_slots: int, heads_pad: int, *, min_query_rows: int,
                   max_query_rows: int) -> int:
    """R: about the rows per request (T/N, a power of two), with the program's query tile
    M = R * Qp within [min_query_rows, max_query_rows] (as far as Qp allows).

    Fewer rows per request than R wastes MMA work on other requests' rows; more splits a
    request into several chunks that each re-read its KV.
    """
    low = max(1, min_query_rows // heads_pad)
    high = max(low, max_query_rows // heads_pad)
    return min(max(pow2_at_least(-(-num_rows // num_slots), 1), low), high)


def num_chunks(num_rows: int, num_slots: int, rows_per_chunk: int) -> int:
    """C: at most N runs of one slot, each split every R rows (and never more than T)."""
    return min(num_rows, num_slots + -(-num_rows // rows_per_chunk))


def chunk_rows(row_slot, row_pos, *, num_slots: int, max_len: int,
               rows_per_chunk: int) -> RowChunks:
    """Cut the rows into runs of one slot, at most R rows each."""
    t = row_slot.shape[0]
    c = num_chunks(t, num_slots, rows_per_chunk)
    row = jnp.arange(t, dtype=jnp.int32)  # [T]
    valid = (row_slot >= 0) & (row_slot < num_slots)
    prev = jnp.concatenate([jnp.full((1,), -1, jnp.int32), row_slot[:-1]])
    run_start = lax.cummax(jnp.where(row_slot != prev, row, 0))  # [T] first row of the run
    opens = valid & ((row - run_start) % rows_per_chunk == 0)  # [T] row opens a chunk
    chunk = jnp.where(valid, jnp.cumsum(opens) - 1, c)  # [T]; C = dropped
    start = jnp.full((c,), t, jnp.int32).at[jnp.where(opens, chunk, c)].set(row, mode="drop")
    rows = jnp.zeros((c,), jnp.int32).at[chunk].add(1, mode="drop")
    slot = jnp.zeros((c,), jnp.int32).at[chunk].set(row_slot, mode="drop")
    # Positions past the strip are clipped like the XLA path's gathers, never read beyond S.
    pos = jnp.clip(row_pos, 0, max_len - 1).astype(jnp.int32)
    max_pos = jnp.zeros((c,), jnp.int32).at[chunk].max(pos, mode="drop")
    return RowChunks(start, rows, slot, max_pos)


def query_tiles(q, row_pos, *, num_kv_heads: int, heads_pad: int, rows_per_chunk: int):
    """q [T, Q, D] -> [G, (T+R) * Qp, D] and each query row's position i32[(T+R) * Qp].

    R spare rows keep the last chunk's tile (and unused chunks', start = T) in bounds; padded
    heads are zero.
    """
    t, num_q, d = q.shape
    group = num_q // num_kv_heads
    qg = q.reshape(t, num_kv_heads, group, d)
    qg = jnp.pad(qg, ((0, rows_per_chunk), (0, 0), (0, heads_pad - group), (0, 0)))
    tiles = qg.transpose(1, 0, 2, 3).reshape(num_kv_heads, (t + rows_per_chunk) * heads_pad, d)
    positions = jnp.repeat(jnp.pad(row_pos, (0, rows_per_chunk)), heads_pad)
    return tiles, positions


def rows_from_tiles(out, row_slot, *, num_q: int, num_slots: int, heads_pad: int,
                    rows_per_chunk: int, dtype):
    """The kernels' [G, (T+R) * Qp, D] output back to [T, Q, D]; padding rows (which no chunk
    covers, so no program wrote) are zero."""
    g, _, d = out.shape
    t = row_slot.shape[0]
    out = out.reshape(g, t + rows_per_chunk, heads_pad, d)[:, :t, : num_q // g]  # [G, T, Q/G, D]
    out = out.transpose(1, 0, 2, 3).reshape(t, num_q, d)
    valid = (row_slot >= 0) & (row_slot < num_slots)
    return jnp.where(valid[:, None, None], out, 0).astype(dtype)
