"""verify_attention: kernel (interpret mode) == reference, reference == the model's XLA path.

Caches are NaN wherever no row may look (past each slot's largest row position, and whole
slots without rows), so any stale read, or any 0 * NaN in the last partial block, shows up.

Axis legend: T rows, N slots, L layers, S cache length, G KV heads, Q query heads, D head dim.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from lightspec_jax.models.attention import cached_attention
from lightspec_jax.pallas_kernels import verify_attention, verify_attention_reference


def make_case(rng, *, n, s, g, group, d, max_rows, pad_rows, dtype, layers=0, nan_fill=True,
              long_slot=0):
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
    if nan_fill:
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
    np.testing.assert_allclose(got, want, **_tolerance(dtype, on_device))
    padding = np.asarray(args[3]) == n
    assert not got[padding].any(), "padding rows must output zeros"


def test_kernel_picks_layer_from_full_cache(kernel_kwargs, on_device):
    rng = np.random.default_rng(7)
    q, k, v, row_slot, row_pos = make_case(rng, n=4, s=64, g=2, group=2, d=32, max_rows=4,
                                           pad_rows=1, dtype=jnp.float32, layers=3)
    got = np.asarray(verify_attention(q, k, v, row_slot, row_pos, layer=2, **kernel_kwargs))
    want = np.asarray(verify_attention_reference(q, k[2], v[2], row_slot, row_pos))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, **_tolerance(jnp.float32, on_device))


@pytest.mark.parametrize("case", CASES[:3], ids=["D32", "D64", "D128"])
def test_reference_matches_xla_path(case):
    """The reference agrees with models/attention.cached_attention, an independent blockwise
    implementation, on a NaN-free cache (the XLA path reads whole blocks unmasked)."""
    n, s, g, group, d, max_rows, pad_rows, _ = case
    rng = np.random.default_rng(3)
    q, k, v, row_slot, row_pos = make_case(rng, n=n, s=s, g=g, group=group, d=d,
                                           max_rows=max_rows, pad_rows=pad_rows,
                                           dtype=jnp.float32, layers=2, nan_fill=False)
    k, v = jnp.nan_to_num(k), jnp.nan_to_num(v)  # the unused layer 0 too
    want = np.asarray(verify_attention_reference(q, k, v, row_slot, row_pos, layer=1))
    got = np.asarray(cached_attention(q, k, v, 1, row_slot, jnp.minimum(row_pos, s - 1),
                                      block=32))
    real = np.asarray(row_slot) < n  # the XLA path leaves garbage in padding rows
    np.testing.assert_allclose(got[real], want[real], atol=2e-5, rtol=2e-5)


def test_shape_errors_name_the_shapes():
    q = jnp.zeros((3, 4, 32))
    cache = jnp.zeros((2, 16, 2, 32))
    with pytest.raises(ValueError, match=r"\(5,\)"):
        verify_attention(q, cache, cache, jnp.zeros(5, jnp.int32), jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="multiple of G"):
        verify_attention(jnp.zeros((3, 3, 32)), cache, cache, jnp.zeros(3, jnp.int32),
                         jnp.zeros(3, jnp.int32))
