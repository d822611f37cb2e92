"""verify_attention: kernel (interpret mode) == reference, and the reference against a numpy
brute force (one dense softmax per row and head).

Caches are NaN wherever no row may look (past each slot's largest row position, and whole
slots without rows), so any stale read, or any 0 * NaN in the last partial block, shows up.
Padding rows (slot = N) may give any finite values: only real rows are compared.

Axis legend: T rows, N slots, L layers, S cache length, G KV heads, Q query heads, D head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lightspec_jax.pallas_kernels import (
    CACHE_LEN_MULTIPLE,
    verify_attention,
    verify_attention_reference,
)


def make_case(rng, *, n, s, g, group, d, max_rows, pad_rows, dtype, layers=0, long_slot=0):
    """q [T, Q, D], k/v cache [(L,) N, S, G, D], row_slot/row_pos [T] in the verify layout.

    A random subset of slots has 1..max_rows contiguous rows at consecutive positions, the runs
    in random slot order; ``long_slot`` extra rows go to one slot (more rows than one chunk);
    ``pad_rows`` padding rows (slot = N, arbitrary positions) come last.
    """
    active = rng.permutation(n)[: max(1, rng.integers(n // 2, n + 1))]
    row_slot, row_pos = [], []
    for i, slot in enumerate(active):
        count = int(rng.integers(1, max_rows + 1)) + (long_slot if i == 0 else 0)
        first = int(rng.integers(0, s - count + 1))
        row_slot += [slot] * count
        row_pos += list(range(first, first + count))
    row_slot += [n] * pad_rows
    row_pos += list(rng.integers(0, 2 * s, pad_rows))
    t = len(row_slot)
    shape = (n, s, g, d)
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    row_slot, row_pos = np.array(row_slot, np.int32), np.array(row_pos, np.int32)
    for slot in range(n):
        mine = row_pos[row_slot == slot]
        unused = slice(int(mine.max()) + 1 if mine.size else 0, None)
        k[slot, unused] = np.nan
        v[slot, unused] = np.nan
    if layers:  # the wanted layer is the last; the others are all NaN
        k = np.concatenate([np.full((layers - 1, *shape), np.nan, np.float32), k[None]])
        v = np.concatenate([np.full((layers - 1, *shape), np.nan, np.float32), v[None]])
    q = rng.standard_normal((t, g * group, d)).astype(np.float32)
    cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), jnp.asarray(row_slot), jnp.asarray(row_pos)


# (N, S, G, Q/G, D, max rows per slot, padding rows, long slot extra rows)
CASES = [
    (4, 64, 2, 1, 32, 3, 2, 0),
    (8, 128, 1, 4, 64, 12, 5, 0),
    (5, 96, 2, 5, 128, 4, 3, 0),  # Q/G = 5 -> padded to 8, S = 96 -> 32-position blocks
    (8, 64, 4, 2, 32, 1, 0, 0),  # decode-like: one row per slot, no padding
    (8, 256, 2, 3, 64, 2, 1, 40),  # one slot spans many chunks
]


def attention_by_numpy(q, k_cache, v_cache, row_slot, row_pos):
    """f64 [T, Q, D]: each real row's heads softmax over its slot's positions 0 .. row_pos, one
    at a time; padding rows stay NaN."""
    q, k_cache, v_cache = (np.asarray(x, np.float32).astype(np.float64)
                           for x in (q, k_cache, v_cache))
    row_slot, row_pos = np.asarray(row_slot), np.asarray(row_pos)
    t, num_q, d = q.shape
    n, _, g, _ = k_cache.shape
    out = np.full((t, num_q, d), np.nan)
    for row in range(t):
        slot, pos = row_slot[row], row_pos[row]
        if slot >= n:
            continue
        for head in range(num_q):
            kv_head = head // (num_q // g)
            keys = k_cache[slot, : pos + 1, kv_head]  # [pos+1, D]
            values = v_cache[slot, : pos + 1, kv_head]
            scores = keys @ q[row, head] / np.sqrt(d)
            probs = np.exp(scores - scores.max())
            out[row, head] = probs @ values / probs.sum()
    return out


def _tolerance(dtype, on_device):
    if dtype == jnp.bfloat16:  # the kernel rounds probabilities to bf16 before P @ V
        return dict(atol=3e-2, rtol=3e-2)
    return dict(atol=2e-3, rtol=2e-3) if on_device else dict(atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "N{}-S{}-G{}-QG{}-D{}-r{}-p{}-l{}".format(*c))
def test_kernel_matches_reference(case, dtype, kernel_kwargs, on_device):
    n, s, g, group, d, max_rows, pad_rows, long_slot = case
    rng = np.random.default_rng(hash(case) % 2**32)
    args = make_case(rng, n=n, s=s, g=g, group=group, d=d, max_rows=max_rows,
                     pad_rows=pad_rows, dtype=dtype, long_slot=long_slot)
    got = np.asarray(verify_attention(*args, **kernel_kwargs), np.float32)
    want = np.asarray(verify_attention_reference(*args), np.float32)
    assert np.isfinite(want).all()
    assert np.isfinite(got).all(), "the kernel read a NaN-filled (stale) cache entry"
    real = np.asarray(args[3]) < n
    np.testing.assert_allclose(got[real], want[real], **_tolerance(dtype, on_device))


def test_kernel_picks_layer_from_full_cache(kernel_kwargs, on_device):
    rng = np.random.default_rng(7)
    q, k, v, row_slot, row_pos = make_case(rng, n=4, s=64, g=2, group=2, d=32, max_rows=4,
                                           pad_rows=1, dtype=jnp.float32, layers=3)
    got = np.asarray(verify_attention(q, k, v, row_slot, row_pos, layer=2, **kernel_kwargs))
    want = np.asarray(verify_attention_reference(q, k[2], v[2], row_slot, row_pos))
    assert np.isfinite(got).all()
    real = np.asarray(row_slot) < 4
    np.testing.assert_allclose(got[real], want[real], **_tolerance(jnp.float32, on_device))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("block", [16, 48, 128])  # many blocks, blocks not dividing S, one
@pytest.mark.parametrize("case", CASES, ids=lambda c: "N{}-S{}-G{}-QG{}-D{}-r{}-p{}-l{}".format(*c))
def test_reference_matches_brute_force(case, block, dtype):
    """The blockwise online softmax == one dense softmax per row, on NaN-filled caches, with the
    layer picked out of a full [L, ...] cache whose other layers are all NaN."""
    n, s, g, group, d, max_rows, pad_rows, long_slot = case
    rng = np.random.default_rng(hash((case, block)) % 2**32)
    q, k, v, row_slot, row_pos = make_case(rng, n=n, s=s, g=g, group=group, d=d,
                                           max_rows=max_rows, pad_rows=pad_rows, dtype=dtype,
                                           layers=2, long_slot=long_slot)
    got = np.asarray(verify_attention_reference(q, k, v, row_slot, row_pos, layer=1,
                                                block=block), np.float32)
    want = attention_by_numpy(q, k[1], v[1], row_slot, row_pos)
    assert np.isfinite(got).all(), "the reference let a NaN-filled (stale) entry through"
    real = np.asarray(row_slot) < n
    bf16 = dtype == jnp.bfloat16  # probabilities and the output are rounded to bf16
    np.testing.assert_allclose(got[real], want[real], atol=3e-2 if bf16 else 1e-5,
                               rtol=3e-2 if bf16 else 1e-5)


def test_op_runs_the_reference_off_gpu(monkeypatch):
    """impl=None: the kernel only on a GPU backend, and never for LIGHTSPEC_REFERENCE_OPS."""
    rng = np.random.default_rng(11)
    args = make_case(rng, n=4, s=64, g=2, group=2, d=32, max_rows=3, pad_rows=2,
                     dtype=jnp.float32)
    want = np.asarray(verify_attention_reference(*args))
    if jax.default_backend() != "gpu":
        np.testing.assert_array_equal(np.asarray(verify_attention(*args)), want)
    monkeypatch.setenv("LIGHTSPEC_REFERENCE_OPS", "verify_attention")
    verify_attention.clear_cache()  # the route is chosen at trace time
    np.testing.assert_array_equal(np.asarray(verify_attention(*args)), want)
    verify_attention.clear_cache()


def test_shape_errors_name_the_shapes():
    q = jnp.zeros((3, 4, 32))
    cache = jnp.zeros((2, 16, 2, 32))
    with pytest.raises(ValueError, match=r"\(5,\)"):
        verify_attention(q, cache, cache, jnp.zeros(5, jnp.int32), jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="multiple of G"):
        verify_attention(jnp.zeros((3, 3, 32)), cache, cache, jnp.zeros(3, jnp.int32),
                         jnp.zeros(3, jnp.int32))
    odd = jnp.zeros((2, 24, 2, 32))  # S = 24: fine for the reference, not for the kernel
    rows = (jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32))
    assert verify_attention(q, odd, odd, *rows, impl="reference").shape == q.shape
    with pytest.raises(ValueError, match=f"S = 24 must be a multiple of {CACHE_LEN_MULTIPLE}"):
        verify_attention(q, odd, odd, *rows, impl="pallas", interpret=True)


# The Mosaic GPU kernel (verify_attention_mosaic.py) takes 16-bit caches with head_dim a multiple
# of 64 and S a multiple of its 64-position block: (N, S, G, Q/G, D, rows, padding, long slot).
MOSAIC_CASES = [
    (4, 64, 2, 1, 64, 3, 2, 0),  # Qp = 1: 64 rows per chunk
    (8, 128, 1, 4, 64, 12, 5, 0),  # 16 rows per chunk, runs of up to 12 rows
    (5, 128, 2, 5, 128, 4, 3, 0),  # Q/G = 5 -> padded to 8
    (8, 64, 4, 2, 64, 1, 0, 0),  # decode-like: one row per slot, no padding
    (8, 256, 2, 3, 64, 2, 1, 40),  # one slot spans several chunks and KV blocks
    (4, 128, 2, 5, 128, 12, 2, 40),  # over 8 rows per request: 128-row tiles (R = 16, Qp = 8)
]


@pytest.fixture(scope="session")
def mosaic_kwargs(on_device):
    """The Mosaic GPU kernel: jax's GPU interpreter on the CPU, compiled on the device run."""
    return {"impl": "mosaic", "interpret": not on_device}


@pytest.mark.parametrize(
    "case, dtype",
    [(c, jnp.bfloat16) for c in MOSAIC_CASES] + [(MOSAIC_CASES[2], jnp.float16)],
    ids=["N{}-S{}-G{}-QG{}-D{}-r{}-p{}-l{}-bf16".format(*c) for c in MOSAIC_CASES]
    + ["N{}-S{}-G{}-QG{}-D{}-r{}-p{}-l{}-f16".format(*MOSAIC_CASES[2])])
def test_mosaic_kernel_matches_reference(case, dtype, mosaic_kwargs):
    """On caches that are NaN past each slot's last row, so the last block's masking shows."""
    n, s, g, group, d, max_rows, pad_rows, long_slot = case
    rng = np.random.default_rng(hash(case) % 2**32)
    args = make_case(rng, n=n, s=s, g=g, group=group, d=d, max_rows=max_rows,
                     pad_rows=pad_rows, dtype=dtype, long_slot=long_slot, layers=2)
    if case == MOSAIC_CASES[-1]:
        from lightspec_jax.pallas_kernels.verify_attention_mosaic import rows_per_chunk
        assert rows_per_chunk(len(args[3]), n, 8) * 8 == 128
    got = np.asarray(verify_attention(*args, layer=1, **mosaic_kwargs), np.float32)
    want = np.asarray(verify_attention_reference(*args, layer=1), np.float32)
    assert np.isfinite(got).all(), "the Mosaic kernel read a NaN-filled (stale) cache entry"
    real = np.asarray(args[3]) < n
    np.testing.assert_allclose(got[real], want[real], **_tolerance(jnp.bfloat16, True))


def test_mosaic_kernel_refuses_what_it_does_not_take():
    rng = np.random.default_rng(5)
    kw = dict(n=4, s=64, g=2, group=2, max_rows=2, pad_rows=0)
    cases = [(make_case(rng, d=64, dtype=jnp.float32, **kw), "bfloat16 or float16"),
             (make_case(rng, d=32, dtype=jnp.bfloat16, **kw), "head_dim a multiple of 64"),
             (make_case(rng, d=64, dtype=jnp.bfloat16, **{**kw, "s": 96}), "S = 96")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            verify_attention(*args, impl="mosaic", interpret=True)


def test_mosaic_route_where_asked_and_supported(monkeypatch):
    """LIGHTSPEC_MOSAIC_OPS sends verify_attention to the Mosaic kernel where it takes the
    arguments and leaves the rest on Triton; only ops with a Mosaic kernel may be named."""
    from lightspec_jax.pallas_kernels import fill, verify_attention_mosaic

    calls = []
    real = verify_attention_mosaic.verify_attention_mosaic

    def spy(*args, **kwargs):
        calls.append(args[0].dtype)
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_attention_mosaic, "verify_attention_mosaic", spy)
    rng = np.random.default_rng(9)
    kw = dict(n=4, s=64, g=2, group=2, d=64, max_rows=2, pad_rows=1)
    bf16, f32 = (make_case(rng, dtype=dt, **kw) for dt in (jnp.bfloat16, jnp.float32))

    def run(args):
        verify_attention.clear_cache()  # the route is chosen at trace time
        return np.asarray(verify_attention(*args, interpret=True), np.float32)

    run(bf16)
    assert calls == []  # not asked: Triton
    monkeypatch.setenv("LIGHTSPEC_MOSAIC_OPS", "verify_attention")
    got = run(bf16)
    assert calls == [jnp.bfloat16]
    want = np.asarray(verify_attention_reference(*bf16), np.float32)
    real_rows = np.asarray(bf16[3]) < 4
    np.testing.assert_allclose(got[real_rows], want[real_rows], **_tolerance(jnp.bfloat16, True))
    run(f32)  # float32: Triton
    assert calls == [jnp.bfloat16]
    monkeypatch.setenv("LIGHTSPEC_MOSAIC_OPS", "fill")
    with pytest.raises(ValueError, match="unknown ops"):
        run(bf16)
    verify_attention.clear_cache()
    with pytest.raises(ValueError, match="fill has no Mosaic GPU kernel"):
        fill(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32), jnp.ones(2, bool), num_rows=2,
             impl="mosaic")
