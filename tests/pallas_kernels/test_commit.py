"""commit: kernel (interpret mode) == reference, and the reference against a python loop.

Axis legend: N slots, K max draft depth, B verify rows, S stop ids.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightspec_jax.pallas_kernels import CommitResult, FillResult, commit, verify

# (N, K, B, S)
SWEEP = [
    (1, 1, 2, 1),
    (3, 3, 7, 0),
    (8, 7, 40, 3),
    (8, 15, 128, 5),
    (32, 11, 300, 2),
]


@pytest.fixture(scope="session")
def make_step(random_fill_result, verify_inputs):
    def make(rng, n, k, num_rows, stops_per_slot):
        """Commit's arguments after one verified step; stop ids from the tiny vocab, -1 padded."""
        fill_result, active = random_fill_result(rng, n, k, num_rows, "ties")
        target, draft = verify_inputs(rng, fill_result, n, k, vocab=4)
        accepted, out_tokens, num_new = (
            np.asarray(x) for x in verify(target, fill_result, draft, impl="reference")
        )
        stop_ids = rng.integers(-1, 6, (n, stops_per_slot)).astype(np.int32)
        remaining = rng.integers(-1, k + 3, n).astype(np.int32)
        seq_len = rng.integers(0, 1000, n).astype(np.int32)
        # A few slots that fill verified but the engine no longer counts as active must not step.
        active = active & (rng.random(n) > 0.1)
        return out_tokens, num_new, accepted, fill_result, seq_len, active, stop_ids, remaining

    return make


def commit_by_loop(out_tokens, num_new, accepted, fill, seq_len, active, stop_ids, remaining):
    n = out_tokens.shape[0]
    emitted = np.zeros(n, np.int32)
    finished = np.zeros(n, bool)
    new_seq_len = seq_len.copy()
    new_last = np.full(n, -1, np.int32)
    for i in range(n):
        if not (active[i] and fill.slot_valid[i]):
            continue
        stops = {int(s) for s in stop_ids[i] if s >= 0}
        for token in out_tokens[i, : num_new[i]]:
            if emitted[i] >= remaining[i]:
                break
            emitted[i] += 1
            if token in stops:
                finished[i] = True
                break
        finished[i] |= emitted[i] >= remaining[i]
        new_seq_len[i] += accepted[i] + 1
        new_last[i] = out_tokens[i, accepted[i]]
    tail_row = fill.row_start + accepted
    return emitted, finished, new_seq_len, new_last, tail_row


def assert_commit_equal(got, want) -> None:
    for name, g, w in zip(CommitResult._fields, got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("n,k,num_rows,stops_per_slot", SWEEP)
def test_kernel_matches_reference(n, k, num_rows, stops_per_slot, make_step):
    rng = np.random.default_rng(n * 100 + k)
    for _ in range(3):
        args = make_step(rng, n, k, num_rows, stops_per_slot)
        got = commit(*args, impl="pallas", interpret=True)
        want = commit(*args, impl="reference")
        assert_commit_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from([(1, 1, 2, 1), (4, 3, 9, 2), (6, 7, 30, 4)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_reference_truncates_at_stop_and_remaining(shape, seed, make_step):
    n, k, num_rows, stops_per_slot = shape
    args = make_step(np.random.default_rng(seed), n, k, num_rows, stops_per_slot)
    got = commit(*args, impl="reference")
    assert_commit_equal(got, commit_by_loop(*args))


def test_stop_id_is_emitted_and_finishes():
    # Slot 0 accepts 2 drafts; its second token is a stop id: emit 2 tokens, finish.
    # Slot 1 has no stop but only 1 token of allowance left: emit 1, finish.
    fill_result = FillResult(
        lengths=jnp.array([3, 1]),
        row_start=jnp.array([0, 4]),
        slot_valid=jnp.array([True, True]),
        row_slot=jnp.array([0, 0, 0, 0, 1, 1]),
        row_offset=jnp.array([0, 1, 2, 3, 0, 1]),
        row_valid=jnp.ones(6, bool),
    )
    out_tokens = jnp.array([[5, 2, 6, -1], [7, 8, -1, -1]])
    args = (
        out_tokens,
        jnp.array([3, 2]),  # num_new
        jnp.array([2, 1]),  # accepted
        fill_result,
        jnp.array([10, 20]),  # seq_len
        jnp.array([True, True]),
        jnp.array([[2, -1], [-1, -1]]),  # stop ids
        jnp.array([100, 1]),  # remaining
    )
    for impl in ("reference", "pallas"):
        got = commit(*args, impl=impl, interpret=True)
        np.testing.assert_array_equal(got.num_emitted, [2, 1])
        np.testing.assert_array_equal(got.finished, [True, True])
        np.testing.assert_array_equal(got.new_seq_len, [13, 22])
        np.testing.assert_array_equal(got.new_last_token, [6, 8])
        np.testing.assert_array_equal(got.tail_row, [2, 5])


def test_shape_errors_name_the_shapes(make_step):
    args = list(make_step(np.random.default_rng(0), 3, 3, 6, 1))
    bad_remaining = args[:7] + [np.zeros(4, np.int32)]
    with pytest.raises(ValueError, match=r"remaining \(4,\)"):
        commit(*bad_remaining)
    bad_stops = args[:6] + [np.zeros((2, 1), np.int32)] + args[7:]
    with pytest.raises(ValueError, match=r"stop_ids must be \[N=3, S\], got \(2, 1\)"):
        commit(*bad_stops)
