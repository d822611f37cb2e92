"""verify_attention on Mosaic GPU, jax's Pallas backend for Hopper (the Triton route has been
deprecated since jax 0.11). Same op, same row layout (_row_chunks.py), same results as the
Triton kernel in verify_attention.py, whose docstring describes the op.

One program per (chunk, KV head), one warpgroup each:
- TMA copies bring the chunk's [M, D] query tile and, double-buffered, the slot's [blk, D] K and
  V blocks into shared memory; the copy of block b+1 is in flight while block b computes.
- Scores are a WGMMA of the query tile against the K block, transposed in shared memory; the
  online softmax runs in registers (fp32); P, rounded to the cache dtype, is the register
  operand of the second WGMMA against the V block.
- The loop stops at the block holding the chunk's largest position. That last block's V rows
  past it are zeroed in shared memory before the product: a stale (even NaN) entry there would
  otherwise reach the output through 0 * NaN. K needs nothing: its scores are masked.
- The output leaves through a plain shared-memory tile, stored with static-size TMA copies, one
  per set bit of the chunk's row count, so a chunk never writes the next chunk's rows. (Ragged
  stores by binary decomposition are also what jax's ``pallas/ops/gpu/ragged_dot_mgpu.py``
  does.)

M = R * Qp query rows per program, 64 or 128 (one or two warpgroup tiles of WGMMA rows): R
follows the rows per request as in the Triton kernel, so a verify request's up to 16 rows are
one chunk, its KV read once, where Qp <= 8. Plain decoding (one row per request) leaves all
but Qp rows of the 64-row tile idle, which costs MMA work, not bandwidth.

What it takes (``unsupported`` names what it does not): bf16 or f16 (WGMMA's 16-bit inputs;
f32 stays on Triton), head_dim a multiple of 64 (the 128-byte swizzle), S a multiple of the KV
block, Q/G <= 64.

Interpret mode (``interpret=True``) runs jax's Mosaic GPU interpreter on the CPU: the TMA copies,
barriers, double buffering, masking and ragged stores as compiled. The interpreter has no rule
for a transposed or register WGMMA operand, nor for register layouts (layout hints, a load into
a given layout), so there the two products are jnp dots on the same shared-memory tiles and the
layouts are left to it. The compiled WGMMAs and layouts are checked by lowering for an H200
(tests/pallas_kernels/test_cuda_lowering.py) and on the device check.

Axis legend: T rows, N slots, L layers, S cache length, G KV heads, Q query heads, D head dim,
C chunks, R rows per chunk, Qp = Q/G padded to a power of two, M = R * Qp, blk = KV block.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ._backend import pow2_at_least
from . import _row_chunks
from ._row_chunks import chunk_rows, query_tiles, rows_from_tiles

# Query rows (rows x padded heads) of one program: a warpgroup's WGMMA tile height, or two.
BLOCK_Q_MIN, BLOCK_Q_MAX = 64, 128
# Cache positions per KV block; S must be a multiple (engines' strips past 128 tokens are).
BLOCK_KV = 64
# 128-byte swizzled, (8, 64)-tiled shared memory: the layout WGMMA reads 16-bit operands from.
_SWIZZLE_BYTES = 128
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_DTYPES = (jnp.bfloat16, jnp.float16)


def unsupported(q_shape, q_dtype, cache_shape, block_kv: int = BLOCK_KV) -> str | None:
    """Why the Mosaic GPU kernel cannot take these arguments, or None if it can.

    cache_shape: [N, S, G, D] or [L, N, S, G, D].
    """
    num_q, d = q_shape[-2:]
    s, g = cache_shape[-3], cache_shape[-2]
    if jnp.dtype(q_dtype) not in map(jnp.dtype, _DTYPES):
        return f"the Mosaic GPU verify_attention takes bfloat16 or float16, not {q_dtype}"
    lanes = _SWIZZLE_BYTES // jnp.dtype(q_dtype).itemsize
    if d % lanes:
        return f"the Mosaic GPU verify_attention needs head_dim a multiple of {lanes}, got {d}"
    if s % block_kv:
        return (f"the Mosaic GPU verify_attention needs the cache length S a multiple of its "
                f"{block_kv}-position KV block, got S = {s}")
    if pow2_at_least(num_q // g, 1) > BLOCK_Q_MIN:
        return (f"the Mosaic GPU verify_attention takes at most {BLOCK_Q_MIN} query heads per KV "
                f"head, got {num_q // g}")
    return None


def _interpreter():
    """jax's Mosaic GPU interpreter parameters (CPU runs of the kernel)."""
    params = getattr(plgpu, "InterpretParams", None)
    if params is None:
        try:  # jax 0.10 does not export it yet
            from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams as params
        except ImportError as exc:
            raise RuntimeError(f"jax {jax.__version__} has no Mosaic GPU interpreter: run the "
                               "Mosaic GPU kernel on a GPU, or use impl='pallas'") from exc
    return params()


def _kernel(*refs, block_kv: int, heads_pad: int, rows_per_chunk: int, compiled: bool):
    """Allocates the barriers (the interpreter takes them only from run_scoped) and runs _body."""
    pl.run_scoped(
        functools.partial(_body, *refs, block_kv=block_kv, heads_pad=heads_pad,
                          rows_per_chunk=rows_per_chunk, compiled=compiled),
        plgpu.Barrier(num_barriers=2),  # query tile, positions
        plgpu.Barrier(num_barriers=2),  # K, per buffer
        plgpu.Barrier(num_barriers=2),  # V, per buffer
    )


def _body(
    start_ref,  # i32[C] first row of each chunk
    rows_ref,  # i32[C] rows in the chunk (0: unused)
    slot_ref,  # i32[C]
    max_pos_ref,  # i32[C] largest position among the chunk's rows
    layer_ref,  # i32[1]
    pos_ref,  # i32[(T+R) * Qp] each query row's position
    q_ref,  # [G, (T+R) * Qp, D]
    k_ref,  # [L, N, S, G, D]
    v_ref,  # [L, N, S, G, D]
    o_ref,  # out [G, (T+R) * Qp, D]
    q_smem,  # [M, D] swizzled
    o_smem,  # [M, D]
    k_smem,  # [2, blk, D] swizzled
    v_smem,  # [2, blk, D] swizzled
    pos_smem,  # i32[M]
    q_barrier,
    k_barrier,
    v_barrier,
    *,
    block_kv: int,
    heads_pad: int,
    rows_per_chunk: int,
    compiled: bool,
):
    c, g = lax.axis_index("chunk"), lax.axis_index("kv_head")
    start, num_rows, slot = start_ref[c], rows_ref[c], slot_ref[c]
    max_pos, layer = max_pos_ref[c], layer_ref[0]
    block_q, head_dim = q_smem.shape  # M, D
    num_blocks = max_pos // block_kv + 1
    wgmma_row = plgpu.Layout.WGMMA.reduce(1)

    def hint(x, layout):  # a register-layout hint; no effect on values
        return plgpu.layout_cast(x, layout) if compiled else x

    def iota(shape, dim):
        if compiled:
            return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)
        return lax.broadcasted_iota(jnp.int32, shape, dim)

    def fetch(b, buf):  # K and V block b into buffer buf
        positions = (layer, slot, pl.ds(b * block_kv, block_kv), g)
        plgpu.copy_gmem_to_smem(k_ref.at[positions], k_smem.at[buf], k_barrier.at[buf])
        plgpu.copy_gmem_to_smem(v_ref.at[positions], v_smem.at[buf], v_barrier.at[buf])

    @pl.when(num_rows > 0)
    def _():
        query_rows = pl.ds(start * heads_pad, block_q)
        plgpu.copy_gmem_to_smem(q_ref.at[g, query_rows], q_smem, q_barrier.at[0])
        plgpu.copy_gmem_to_smem(pos_ref.at[query_rows], pos_smem, q_barrier.at[1])
        fetch(0, 0)
        plgpu.barrier_wait(q_barrier.at[0])
        plgpu.barrier_wait(q_barrier.at[1])
        if compiled:  # straight into the layout of the score rows
            pos = plgpu.load(pos_smem, (), layout=wgmma_row)  # [M]
        else:
            pos = pos_smem[...]

        def read_block(b, carry):
            acc, running_max, denom = carry  # f32 [M, D], [M], [M]
            buf = lax.rem(b, 2)

            @pl.when(b + 1 < num_blocks)
            def _():  # the other buffer was consumed by the previous iteration
                fetch(b + 1, 1 - buf)

            plgpu.barrier_wait(k_barrier.at[buf])
            if compiled:
                def q_kt(acc_ref):
                    plgpu.wgmma(acc_ref, q_smem, plgpu.transpose_ref(k_smem.at[buf], (1, 0)))
                    return acc_ref[...]
                scores = pl.run_scoped(q_kt, plgpu.ACC((block_q, block_kv), jnp.float32))
            else:
                scores = lax.dot_general(q_smem[...], k_smem[buf], (((1,), (1,)), ((), ())),
                                         preferred_element_type=jnp.float32)  # [M, blk]
            key_pos = b * block_kv + iota((block_q, block_kv), 1)
            visible = key_pos <= lax.broadcast_in_dim(pos, (block_q, block_kv), [0])
            scores = jnp.where(visible, scores * head_dim**-0.5, _MASK_VALUE)
            new_max = jnp.maximum(running_max, scores.max(axis=1))
            # where, not just exp: a row that sees nothing yet would get exp(mask - mask) = 1.
            probs = jnp.where(
                visible, jnp.exp(scores - lax.broadcast_in_dim(new_max, scores.shape, [0])), 0.0)
            correction = jnp.exp(running_max - new_max)  # [M]
            denom = denom * correction + probs.sum(axis=1)

            plgpu.barrier_wait(v_barrier.at[buf])

            @pl.when((b + 1) * block_kv - 1 > max_pos)
            def _():  # the last block: zero V past the chunk's last row (0 * NaN = NaN)
                values = v_smem[buf]  # [blk, D]
                live = b * block_kv + iota(values.shape, 0) <= max_pos
                v_smem[buf] = jnp.where(live, values, jnp.zeros_like(values))
                plgpu.commit_smem()

            probs = probs.astype(v_smem.dtype)
            if compiled:
                def p_v(acc_ref):
                    plgpu.wgmma(acc_ref, probs, v_smem.at[buf])
                    return acc_ref[...]
                pv = pl.run_scoped(p_v, plgpu.ACC((block_q, head_dim), jnp.float32))
            else:
                pv = jnp.dot(probs, v_smem[buf], preferred_element_type=jnp.float32)  # [M, D]
            acc = acc * lax.broadcast_in_dim(correction, acc.shape, [0]) + pv
            return acc, new_max, denom

        init = (hint(jnp.zeros((block_q, head_dim), jnp.float32), plgpu.Layout.WGMMA),
                hint(jnp.full((block_q,), _MASK_VALUE, jnp.float32), wgmma_row),
                hint(jnp.zeros((block_q,), jnp.float32), wgmma_row))
        acc, _, denom = lax.fori_loop(0, num_blocks, read_block, init)
        denom = jnp.where(denom > 0, denom, 1.0)  # rows that saw nothing (padding) give 0
        o_smem[...] = (acc / lax.broadcast_in_dim(denom, acc.shape, [0])).astype(o_smem.dtype)
        plgpu.commit_smem()
        # Exactly the chunk's num_rows * Qp query rows: TMA boxes have static sizes, so one
        # copy per set bit of num_rows, largest first.
        done = jnp.int32(0)
        size = rows_per_chunk
        while size >= 1:
            @pl.when((num_rows & size) != 0)
            def _(done=done, size=size):
                plgpu.copy_smem_to_gmem(
                    o_smem.at[pl.ds(done * heads_pad, size * heads_pad)],
                    o_ref.at[g, pl.ds((start + done) * heads_pad, size * heads_pad)])
            done = done + (num_rows & size)
            size //= 2
        plgpu.wait_smem_to_gmem(0)


def rows_per_chunk(num_rows: int, num_slots: int, heads_pad: int) -> int:
    """R for the Mosaic kernel: M = R * Qp in [64, 128]. So a verify step's request (up to
    K+1 = 16 rows) is one chunk, its KV read once, wherever M = 128 allows (Qp <= 8 at 16
    rows); M = 64 otherwise: a second warpgroup tile of accumulators costs registers."""
    return _row_chunks.rows_per_chunk(num_rows, num_slots, heads_pad,
                                      min_query_rows=BLOCK_Q_MIN, max_query_rows=BLOCK_Q_MAX)


def verify_attention_mosaic(q, k_cache, v_cache, row_slot, row_pos, *, layer,
                            interpret: bool = False, block_kv: int = BLOCK_KV) -> jax.Array:
    """The Mosaic GPU kernel: arguments as ``verify_attention`` takes them, checked by it, with
    the cache [L, N, S, G, D] and ``layer`` given; row_slot and row_pos i32[T].

    Raises ValueError with ``unsupported``'s reason for arguments it does not take.
    """
    reason = unsupported(q.shape, q.dtype, k_cache.shape, block_kv)
    if reason:
        raise ValueError(reason)
    t, num_q, d = q.shape
    _, n, s, g, _ = k_cache.shape
    heads_pad = pow2_at_least(num_q // g, 1)
    r = rows_per_chunk(t, n, heads_pad)
    block_q = r * heads_pad
    chunks = chunk_rows(row_slot, row_pos, num_slots=n, max_len=s, rows_per_chunk=r)
    q_tiles, pos_tiles = query_tiles(q, row_pos, num_kv_heads=g, heads_pad=heads_pad,
                                     rows_per_chunk=r)
    swizzled = (plgpu.TilingTransform((8, _SWIZZLE_BYTES // q.dtype.itemsize)),
                plgpu.SwizzleTransform(_SWIZZLE_BYTES))
    out = plgpu.kernel(
        functools.partial(_kernel, block_kv=block_kv, heads_pad=heads_pad, rows_per_chunk=r,
                          compiled=not interpret),
        out_type=jax.ShapeDtypeStruct(q_tiles.shape, q.dtype),
        scratch_types=[
            plgpu.SMEM((block_q, d), q.dtype, transforms=swizzled),  # query tile
            plgpu.SMEM((block_q, d), q.dtype),  # output tile (row slices for the stores)
            plgpu.SMEM((2, block_kv, d), q.dtype, transforms=swizzled),  # K blocks
            plgpu.SMEM((2, block_kv, d), q.dtype, transforms=swizzled),  # V blocks
            plgpu.SMEM((block_q,), jnp.int32),  # query positions
        ],
        grid=(chunks.start.shape[0], g),
        grid_names=("chunk", "kv_head"),
        interpret=_interpreter() if interpret else None,
    )(*chunks, jnp.asarray(layer, jnp.int32).reshape(1), pos_tiles, q_tiles, k_cache, v_cache)
    return rows_from_tiles(out, row_slot, num_q=num_q, num_slots=n, heads_pad=heads_pad,
                           rows_per_chunk=r, dtype=q.dtype)
