"""verify_attention: flat verify rows attend to their own slot's KV cache (one layer).

Row t carries (row_slot[t], row_pos[t]) and attends to positions 0 .. row_pos[t] of its slot's
cache strip, the positions the step has just written included, so the rows of one request see
each other causally. One op therefore serves prefill chunks, plain decode and speculative
verification alike; the models call it once per layer. Padding rows (row_slot = N, out of
range, whose KV writes the caller drops) give unspecified finite values that callers ignore.

On a GPU the op runs the Pallas kernel below (the Triton route), or its Mosaic GPU twin in
verify_attention_mosaic.py where LIGHTSPEC_MOSAIC_OPS asks for it; elsewhere
``verify_attention_reference``, a blockwise jnp online softmax that the CPU engine runs, so it
too reads only the live context.

The GPU kernel is laid out for the verify batch: rows are ordered by (slot, offset), so each
request's rows are contiguous. The wrapper cuts them into *chunks* (_row_chunks.py), runs of
at most R rows of one slot, and each program (chunk, KV head) streams that slot's K/V blocks
once for all of its rows and all Q/G query heads of the KV head - a request's KV is read once
per step (twice only when it has more than R rows). The loop stops at the block holding the
chunk's largest position, and the last block's loads are masked there, so neither compute nor
bandwidth goes to the unused tail of the strip and stale (even NaN) entries are never touched.
Online softmax in fp32 as in flash attention; the [M, D] query tile (M = R * Q/G query rows)
is the MMA's M dimension, in the spirit of jax's ``pallas/ops/gpu/decode_attention.py``, which
also packs a KV head's query heads into one tile.

Axis legend: T rows, N slots, L layers, S cache length, G KV heads, Q query heads, D head dim,
C chunks, R rows per chunk, Qp = Q/G padded to a power of two, M = R * Qp.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton
from jax.sharding import PartitionSpec as P

from . import verify_attention_mosaic as mosaic
from ._backend import (
    MODEL_AXIS,
    VERIFY_ATTENTION_TUNING,
    AttentionTuning,
    Impl,
    interpreted,
    model_parallel_size,
    on_local_shards,
    pow2_at_least,
    use_mosaic,
    use_pallas,
)
from . import _row_chunks
from ._row_chunks import chunk_rows, query_tiles, rows_from_tiles

# Finite, so a fully masked row never produces inf - inf = NaN inside the online softmax.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
# Triton's tl.dot needs every matrix dimension >= 16.
_MIN_DOT = 16
# The kernel reads KV in power-of-two blocks that divide S, of at least _MIN_DOT positions: the
# cache lengths it accepts are multiples of this (the reference takes any length).
CACHE_LEN_MULTIPLE = _MIN_DOT


def _check_args(q, k_cache, v_cache, row_slot, row_pos, layer) -> None:
    want_cache = 4 if layer is None else 5
    if q.ndim != 3 or k_cache.ndim != want_cache or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"expected q [T, Q, D] and k_cache == v_cache shaped "
            f"{'[N, S, G, D]' if layer is None else '[L, N, S, G, D] (layer given)'}; got q "
            f"{q.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape}")
    t, num_q, d = q.shape
    num_kv, head_dim = k_cache.shape[-2:]
    if head_dim != d or num_q % num_kv:
        raise ValueError(f"q {q.shape} does not fit the cache {k_cache.shape}: head dims must "
                         f"match and Q must be a multiple of G")
    if row_slot.shape != (t,) or row_pos.shape != (t,):
        raise ValueError(f"row_slot {row_slot.shape} and row_pos {row_pos.shape} must be ({t},) "
                         f"to match q {q.shape}")


REFERENCE_LOOP_SCOPE = "verify_attention_reference_blocks"


def reference_block() -> int:
    """The reference's KV block (positions per loop iteration) on the default backend.

    32 on a CPU: each iteration gathers a [T, block, G, D] tile per row, and smaller tiles
    stay in cache. Measured on a 2-core CPU (8 layers, N = 64 slots, G = 2, D = 64;
    ms for all 8 layers at blocks 32 / 128): a 256-row prefill at context <= 30 with S = 112,
    6.2 / 22.1 (the old rule, block = min(128, S), read the whole short strip: 22.1); 64 decode
    rows at context 60, 4.0 / 7.3; 192 verify rows at context 60, 9.2 / 17.8; 64 decode rows at
    context 1000 (S = 1024), 72 / 89. Blocks of 16 were slower than 32 in every case (loop
    overhead). Elsewhere (a GPU running the reference as a fallback, or under GSPMD) each
    iteration is a device loop trip, so fewer, larger blocks: 128.
    """
    return 32 if jax.default_backend() == "cpu" else 128


def verify_attention_reference(q, k_cache, v_cache, row_slot, row_pos, *, layer=None,
                               block: int | None = None, fixed_block: bool = False):
    """Plain-jnp attention, read blockwise with an online softmax (the CPU engine's path).

    The cache is read in blocks of ``block`` positions (default: reference_block()) and only
    up to the largest real row's position, so the cost follows the live context, not the cache
    length: a speculative engine's longer strip (room for drafts past max_model_len) costs
    nothing until a request gets there. Each row gathers its
    own slot's block, so a request's KV is read once per row (the kernel reads it once per
    request). Invisible entries are zeroed before they touch a sum: a stale (even NaN) entry
    past a row's position never leaks into its output.

    fixed_block: read `block` positions at a time even from a shorter cache (clipped and
    masked), so a row's summation order does not depend on the cache length S; blocks past
    a row's position leave its sums bitwise unchanged (they add exact zeros), so neither does
    it depend on the other rows' positions (the batch-invariant mode).
    """
    _check_args(q, k_cache, v_cache, row_slot, row_pos, layer)
    if block is None:
        block = reference_block()
    if layer is None:
        k_cache, v_cache, layer = k_cache[None], v_cache[None], 0  # [1, N, S, G, D], free
    num_rows, num_q, head_dim = q.shape
    _, n, s, g, _ = k_cache.shape
    block = block if fixed_block else min(block, s)  # need not divide S: positions past the strip are clipped and masked
    valid = (row_slot >= 0) & (row_slot < n)  # [T]
    slot = jnp.where(valid, row_slot, 0)  # [T]
    # Padding rows see nothing (so they stay finite on any cache) and do not extend the read.
    pos = jnp.where(valid, jnp.minimum(row_pos, s - 1), -1)  # [T]
    qg = q.reshape(num_rows, g, num_q // g, head_dim)  # [T, G, Q/G, D]
    offsets = jnp.arange(block)  # [blk]
    # f32 inputs: full-precision dots on every backend (a GPU would use tf32 by default).
    precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None

    def read_block(b, carry):
        running_max, denom, acc = carry  # f32 [T, G, Q/G], [T, G, Q/G], [T, G, Q/G, D]
        key_pos = b * block + offsets  # [blk]
        visible = key_pos[None, :] <= pos[:, None]  # [T, blk]
        kb = k_cache.at[layer, slot[:, None], key_pos[None, :]].get(mode="clip")  # [T, blk, G, D]
        vb = v_cache.at[layer, slot[:, None], key_pos[None, :]].get(mode="clip")  # [T, blk, G, D]
        vb = jnp.where(visible[:, :, None, None], vb, 0)  # 0 * NaN would poison P @ V
        scores = jnp.einsum("tgqd,tsgd->tgqs", qg, kb, precision=precision,
                            preferred_element_type=jnp.float32) * head_dim**-0.5
        scores = jnp.where(visible[:, None, None, :], scores, _MASK_VALUE)  # [T, G, Q/G, blk]
        # A real row sees position 0 in block 0, so running_max is a real score from then on and
        # masked entries get exp(mask - max) = 0. A padding row sees nothing: exp(0) = 1 against
        # a zeroed V, so it ends as 0 / denom = 0.
        new_max = jnp.maximum(running_max, scores.max(axis=-1))
        probs = jnp.exp(scores - new_max[..., None])
        correction = jnp.exp(running_max - new_max)
        denom = denom * correction + probs.sum(axis=-1)
        pv = jnp.einsum("tgqs,tsgd->tgqd", probs.astype(vb.dtype), vb, precision=precision,
                        preferred_element_type=jnp.float32)  # [T, G, Q/G, D]
        return new_max, denom, acc * correction[..., None] + pv

    stats_shape = (num_rows, g, num_q // g)
    init = (jnp.full(stats_shape, _MASK_VALUE, jnp.float32), jnp.zeros(stats_shape, jnp.float32),
            jnp.zeros((*stats_shape, head_dim), jnp.float32))
    num_blocks = jnp.max(pos, initial=0) // block + 1
    # The one loop with a traced trip count in the engine's steps (the CPU path: the kernel's
    # loop runs inside its program); the scope names it for tests/spec/test_step_structure.py.
    with jax.named_scope(REFERENCE_LOOP_SCOPE):
        _, denom, acc = lax.fori_loop(0, num_blocks, read_block, init)
    out = acc / denom[..., None]
    return out.reshape(num_rows, num_q, head_dim).astype(q.dtype)


def _verify_attention_kernel(
    start_ref,  # i32[C] first row of each chunk
    rows_ref,  # i32[C] rows in the chunk (0: unused)
    slot_ref,  # i32[C]
    max_pos_ref,  # i32[C] largest position among the chunk's rows
    layer_ref,  # i32[1]
    pos_ref,  # i32[(T+R) * Qp] each query row's position (row-major over (row, head))
    q_ref,  # [G, (T+R) * Qp, D]
    k_ref,  # [L, N, S, G, D]
    v_ref,  # [L, N, S, G, D]
    o_ref,  # out [G, (T+R) * Qp, D]
    *,
    heads_pad: int,
    block_q: int,
    block_kv: int,
    scale: float,
):
    c, g = pl.program_id(0), pl.program_id(1)
    start, num_rows = start_ref[c], rows_ref[c]
    slot, max_pos, layer = slot_ref[c], max_pos_ref[c], layer_ref[0]
    query_rows = pl.ds(start * heads_pad, block_q)
    q = q_ref[g, query_rows, :]  # [M, D]
    pos = pos_ref[query_rows]  # [M]
    head_dim = q.shape[-1]
    # f32 inputs: full-precision MMAs (Triton would use tf32 by default); bf16: native bf16 MMAs.
    dot_precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None

    def read_block(b, carry):
        running_max, denom, acc = carry  # f32 [M], [M], [M, D]
        key_pos = b * block_kv + lax.broadcasted_iota(jnp.int32, (block_kv,), 0)  # [blk]
        # Masked loads: positions past the chunk's last row are neither fetched nor trusted.
        live = jnp.broadcast_to((key_pos <= max_pos)[:, None], (block_kv, head_dim))
        kv_rows = pl.ds(b * block_kv, block_kv)
        k = pl_triton.load(k_ref.at[layer, slot, kv_rows, g, :], mask=live, other=0.0)
        v = pl_triton.load(v_ref.at[layer, slot, kv_rows, g, :], mask=live, other=0.0)
        scores = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=dot_precision,
                                 preferred_element_type=jnp.float32) * scale  # [M, blk] = q k^T
        visible = key_pos[None, :] <= pos[:, None]  # [M, blk]
        scores = jnp.where(visible, scores, _MASK_VALUE)
        new_max = jnp.maximum(running_max, jnp.max(scores, axis=1))
        # where, not just exp: a row that sees nothing yet would get exp(mask - mask) = 1.
        probs = jnp.where(visible, jnp.exp(scores - new_max[:, None]), 0.0)  # [M, blk]
        correction = jnp.exp(running_max - new_max)
        denom = denom * correction + jnp.sum(probs, axis=1)
        pv = jnp.dot(probs.astype(v.dtype), v, precision=dot_precision,
                     preferred_element_type=jnp.float32)  # [M, D]
        return new_max, denom, acc * correction[:, None] + pv

    init = (jnp.full((block_q,), _MASK_VALUE, jnp.float32), jnp.zeros((block_q,), jnp.float32),
            jnp.zeros((block_q, head_dim), jnp.float32))
    num_blocks = jnp.where(num_rows > 0, max_pos // block_kv + 1, 0)
    _, denom, acc = lax.fori_loop(0, num_blocks, read_block, init)
    out = acc / jnp.where(denom > 0, denom, 1.0)[:, None]
    # Query rows past the chunk belong to the next chunk's program (or are padding).
    mine = lax.broadcasted_iota(jnp.int32, (block_q,), 0) < num_rows * heads_pad
    pl_triton.store(o_ref.at[g, query_rows, :], out.astype(o_ref.dtype),
                    mask=jnp.broadcast_to(mine[:, None], (block_q, head_dim)))


def rows_per_chunk(num_rows: int, num_slots: int, heads_pad: int, tuning: AttentionTuning) -> int:
    """R for the Triton kernel: its tile M = R * Qp from tl.dot's 16 to the tuning's limit."""
    return _row_chunks.rows_per_chunk(num_rows, num_slots, heads_pad, min_query_rows=_MIN_DOT,
                                      max_query_rows=tuning.max_query_rows)


@functools.partial(jax.jit, static_argnames=("impl", "interpret", "tuning"))
def verify_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    row_slot: jax.Array,
    row_pos: jax.Array,
    *,
    layer: jax.Array | int | None = None,
    impl: Impl = None,
    interpret: bool = False,
    tuning: AttentionTuning = VERIFY_ATTENTION_TUNING,
) -> jax.Array:
    """Attention of flat rows q [T, Q, D] against their slots' cache -> [T, Q, D] (q's dtype).

    Args:
      k_cache, v_cache: [N, S, G, D] one layer's cache, or [L, N, S, G, D] with ``layer`` (an
        int or i32 scalar) picking the layer inside the kernel: slicing ``cache[layer]`` in a
        layer scan would copy a whole layer of cache per call.
      row_slot: i32[T] each row's slot; N (out of range) marks padding rows, whose output is
        unspecified but finite.
      row_pos: i32[T] each row's position; it sees cache positions 0 .. row_pos.
      impl, interpret: see ``use_pallas``; by default the kernel on a GPU (unless
        LIGHTSPEC_REFERENCE_OPS names verify_attention), ``verify_attention_reference`` elsewhere.
        The GPU kernel is the Triton one, or the Mosaic GPU one (verify_attention_mosaic.py)
        for ``impl="mosaic"`` (an error for arguments it does not take), or where
        LIGHTSPEC_MOSAIC_OPS names verify_attention and it takes the arguments.

    Scores are scaled by D^-0.5; scores, softmax and accumulation are fp32; GQA maps query head j
    to KV head j // (Q/G). Precondition for the kernel: each slot's rows are contiguous (the
    verify, decode and prefill layouts all are); at most N runs of one slot are supported.
    """
    _check_args(q, k_cache, v_cache, row_slot, row_pos, layer)
    row_slot, row_pos = row_slot.astype(jnp.int32), row_pos.astype(jnp.int32)
    if not use_pallas(impl, interpret=interpret, op="verify_attention"):
        return verify_attention_reference(q, k_cache, v_cache, row_slot, row_pos, layer=layer)

    if layer is None:
        k_cache, v_cache, layer = k_cache[None], v_cache[None], 0  # [1, N, S, G, D], free
    interpret = interpreted(impl, interpret)
    if use_mosaic(impl, op="verify_attention") and (
            impl == "mosaic" or mosaic.unsupported(q.shape, q.dtype, k_cache.shape) is None):
        kernel = functools.partial(mosaic.verify_attention_mosaic, interpret=interpret)
    else:
        kernel = functools.partial(_verify_attention_triton, interpret=interpret, tuning=tuning)
    # Tensor parallelism: each device attends with its own query heads to its own KV heads
    # (engine/sharding.py splits both over the model axis); heads that do not divide stay
    # whole on every device.
    m = model_parallel_size()
    split = q.shape[1] % m == 0 and k_cache.shape[-2] % m == 0
    heads = P(None, MODEL_AXIS, None) if split else P()
    cache = P(None, None, None, MODEL_AXIS, None) if split else P()
    return on_local_shards(
        lambda q, k, v, s, p, layer: kernel(q, k, v, s, p, layer=layer),
        (heads, cache, cache, P(), P(), P()), heads,
    )(q, k_cache, v_cache, row_slot, row_pos, jnp.asarray(layer, jnp.int32))


def _verify_attention_triton(q, k_cache, v_cache, row_slot, row_pos, *, layer, interpret: bool,
                             tuning: AttentionTuning) -> jax.Array:
    """The Triton kernel: cache [L, N, S, G, D] with ``layer`` given, rows checked by the op."""
    t, num_q, d = q.shape
    _, n, s, g, _ = k_cache.shape
    if d & (d - 1) or d < _MIN_DOT:
        raise ValueError(f"head_dim must be a power of two >= {_MIN_DOT} for Triton, got {d}")
    block_kv = min(tuning.block_kv, s & -s)  # a power of two dividing S: no tail block
    if block_kv < _MIN_DOT:
        raise ValueError(f"cache length S = {s} must be a multiple of {CACHE_LEN_MULTIPLE}")
    heads_pad = pow2_at_least(num_q // g, 1)
    r = rows_per_chunk(t, n, heads_pad, tuning)
    chunks = chunk_rows(row_slot, row_pos, num_slots=n, max_len=s, rows_per_chunk=r)
    q_tiles, pos_tiles = query_tiles(q, row_pos, num_kv_heads=g, heads_pad=heads_pad,
                                     rows_per_chunk=r)
    out = pl.pallas_call(
        functools.partial(_verify_attention_kernel, heads_pad=heads_pad, block_q=r * heads_pad,
                          block_kv=block_kv, scale=d**-0.5),
        grid=(chunks.start.shape[0], g),
        out_shape=jax.ShapeDtypeStruct(q_tiles.shape, q.dtype),
        compiler_params=tuning.compiler_params(),
        interpret=interpret,
        name="lightspec_verify_attention",
    )(*chunks, jnp.asarray(layer, jnp.int32).reshape(1), pos_tiles, q_tiles, k_cache, v_cache)
    return rows_from_tiles(out, row_slot, num_q=num_q, num_slots=n, heads_pad=heads_pad,
                           rows_per_chunk=r, dtype=q.dtype)
