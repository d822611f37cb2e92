"""verify: kernel (interpret mode) == reference, and the reference against a python loop.

Axis legend: N slots, K max draft depth, B verify rows.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightspec_jax.pallas_kernels import FillResult, verify

SWEEP = [(1, 1, 2), (3, 3, 3), (3, 11, 20), (8, 7, 40), (8, 15, 128), (32, 1, 64), (32, 11, 300)]


def verify_by_loop(target, fill: FillResult, draft):
    """Slot by slot: walk the rows until the target disagrees with the draft."""
    n, k = draft.shape
    accepted = np.zeros(n, np.int32)
    out = np.full((n, k + 1), -1, np.int32)
    num_new = np.zeros(n, np.int32)
    for i in range(n):
        if not fill.slot_valid[i]:
            continue
        rows = target[fill.row_start[i] : fill.row_start[i] + fill.lengths[i] + 1]
        a = 0
        while a < fill.lengths[i] and rows[a] == draft[i, a]:
            a += 1
        accepted[i], num_new[i] = a, a + 1
        out[i, : a + 1] = rows[: a + 1]
    return accepted, out, num_new


@pytest.mark.parametrize("n,k,num_rows", SWEEP)
def test_kernel_matches_reference(n, k, num_rows, random_fill_result, verify_inputs):
    rng = np.random.default_rng(100 * n + k)
    for regime in ("uniform", "ties", "wild"):
        fill_result, _ = random_fill_result(rng, n, k, num_rows, regime)
        target, draft = verify_inputs(rng, fill_result, n, k)
        got = verify(target, fill_result, draft, impl="pallas", interpret=True)
        want = verify(target, fill_result, draft, impl="reference")
        for name, g, w in zip(("accepted", "out_tokens", "num_new"), got, want):
            assert g.dtype == w.dtype == jnp.int32, name
            np.testing.assert_array_equal(g, w, err_msg=name)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from([(1, 1, 2), (4, 3, 9), (6, 7, 30)]),
    seed=st.integers(0, 2**32 - 1),
    vocab=st.sampled_from([2, 3, 50]),
)
def test_reference_accepts_the_matching_prefix(
    shape, seed, vocab, random_fill_result, verify_inputs
):
    n, k, num_rows = shape
    rng = np.random.default_rng(seed)
    fill_result, _ = random_fill_result(rng, n, k, num_rows, "ties")
    target, draft = verify_inputs(rng, fill_result, n, k, vocab)
    got = verify(target, fill_result, draft, impl="reference")
    want = verify_by_loop(target, fill_result, draft)
    for name, g, w in zip(("accepted", "out_tokens", "num_new"), got, want):
        np.testing.assert_array_equal(g, w, err_msg=name)
    assert np.all(np.asarray(got[0]) <= fill_result.lengths)


def test_all_drafts_accepted_gives_the_bonus_after_the_last_draft():
    # One slot, three drafts verified, the target agrees with all of them.
    fill_result = FillResult(
        lengths=jnp.array([3]),
        row_start=jnp.array([0]),
        slot_valid=jnp.array([True]),
        row_slot=jnp.array([0, 0, 0, 0, 1]),
        row_offset=jnp.array([0, 1, 2, 3, 0]),
        row_valid=jnp.array([True, True, True, True, False]),
    )
    draft = jnp.array([[7, 8, 9, 5]])
    target = jnp.array([7, 8, 9, 4, 0])
    for impl in ("reference", "pallas"):
        accepted, out_tokens, num_new = verify(
            target, fill_result, draft, impl=impl, interpret=True
        )
        assert int(accepted[0]) == 3 and int(num_new[0]) == 4
        np.testing.assert_array_equal(out_tokens, [[7, 8, 9, 4, -1]])


def test_shape_errors_name_the_shapes(random_fill_result):
    fill_result, _ = random_fill_result(np.random.default_rng(0), 3, 3, 6)
    with pytest.raises(ValueError, match=r"\(5,\).*\(6,\)"):
        verify(jnp.zeros(5, jnp.int32), fill_result, jnp.zeros((3, 3), jnp.int32))
    with pytest.raises(ValueError, match=r"\(3,\).*\(4, 3\)"):
        verify(jnp.zeros(6, jnp.int32), fill_result, jnp.zeros((4, 3), jnp.int32))
