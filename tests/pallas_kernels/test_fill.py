"""fill: kernel (interpret mode) == reference == the host rule (planner/fill.py), and the
reference against its invariants.

Axis legend: N slots, K max draft depth, B verify rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightspec_jax.pallas_kernels import OPS, FillResult, fill, fill_reference, use_pallas

# (N, K, B): every N in {1, 3, 8, 32} and K in {1, 3, 7, 11, 15}; B from N to N(K+1).
SWEEP = [
    (1, 1, 1),
    (1, 15, 16),
    (3, 3, 3),
    (3, 7, 13),
    (3, 11, 36),
    (8, 1, 12),
    (8, 7, 40),
    (8, 15, 128),
    (32, 3, 32),
    (32, 7, 100),
    (32, 11, 200),
    (32, 15, 512),
]
REGIMES = ("uniform", "ties", "flat", "wild")


def assert_fill_equal(got: FillResult, want: FillResult) -> None:
    for name, g, w in zip(FillResult._fields, got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("n,k,num_rows", SWEEP)
def test_kernel_matches_reference(n, k, num_rows, fill_inputs):
    rng = np.random.default_rng(1000 * n + 10 * k + num_rows)
    for regime in REGIMES:
        args = fill_inputs(rng, n, k, num_rows, regime)
        got = fill(*args, num_rows=num_rows, impl="pallas", interpret=True)
        want = fill(*args, num_rows=num_rows, impl="reference")
        assert_fill_equal(got, want)


def test_kernel_matches_reference_when_budget_exceeds_candidates(fill_inputs):
    # B > N(K+1): every candidate is kept and the surplus rows are padding.
    args = fill_inputs(np.random.default_rng(7), 3, 3, 20, "uniform")
    got = fill(*args, num_rows=20, impl="pallas", interpret=True)
    assert_fill_equal(got, fill_reference(*args, num_rows=20))


# The sweep, plus budgets beyond every candidate row (B > N(K+1)).
RULE_CASES = SWEEP + [(3, 7, 30), (8, 3, 40), (32, 1, 70)]


@pytest.mark.parametrize("n,k,num_rows", RULE_CASES)
def test_reference_follows_the_host_rule(n, k, num_rows, fill_inputs, fill_by_rule):
    # The regimes bring ties, NaN confidences, proposal_len 0 (and outside [0, K]) and
    # inactive slots.
    rng = np.random.default_rng(100 * n + k + num_rows)
    for regime in REGIMES:
        conf, plen, active = fill_inputs(rng, n, k, num_rows, regime)
        got = fill_reference(conf, plen, active, num_rows=num_rows)
        np.testing.assert_array_equal(got.slot_valid, active, err_msg=regime)
        np.testing.assert_array_equal(got.lengths, fill_by_rule(conf, plen, active, num_rows),
                                      err_msg=regime)


@pytest.mark.parametrize("n,k,num_rows", [(3, 7, 13), (8, 3, 40)])
def test_kernel_follows_the_host_rule(n, k, num_rows, fill_inputs, fill_by_rule):
    rng = np.random.default_rng(100 * n + k + num_rows)
    for regime in REGIMES:
        args = fill_inputs(rng, n, k, num_rows, regime)
        got = fill(*args, num_rows=num_rows, impl="pallas", interpret=True)
        np.testing.assert_array_equal(got.lengths, fill_by_rule(*args, num_rows), err_msg=regime)


def test_reference_follows_the_host_rule_at_every_budget(fill_by_rule):
    # NaN (ranks as 0.01), a tie across slots 0 and 1 at 0.5, a slot with no proposal, an
    # inactive slot; budgets from the target rows alone to past every draft.
    conf = np.array([[0.5, np.nan, 0.9], [0.5, 0.5, 0.5], [0.99, 0.99, 0.99], [0.8, 0.8, 0.8]],
                    np.float32)
    plen = np.array([3, 3, 0, 3], np.int32)
    active = np.array([True, True, True, False])
    for num_rows in range(3, 12):
        got = fill_reference(conf, plen, active, num_rows=num_rows)
        np.testing.assert_array_equal(got.lengths, fill_by_rule(conf, plen, active, num_rows),
                                      err_msg=f"B={num_rows}")


def test_budget_below_active_slots_keeps_first_target_rows():
    # Precondition violated (B < active slots): the first B active slots get only their target
    # row; the others get no row at all.
    conf = np.full((5, 3), 0.9, np.float32)
    active = np.array([True, False, True, True, True])
    plen = np.full(5, 3, np.int32)
    want = fill_reference(conf, plen, active, num_rows=2)
    np.testing.assert_array_equal(want.slot_valid, [True, False, True, False, False])
    np.testing.assert_array_equal(want.lengths, 0)
    np.testing.assert_array_equal(want.row_start, [0, 2, 1, 2, 2])
    np.testing.assert_array_equal(want.row_slot, [0, 2])
    got = fill(conf, plen, active, num_rows=2, impl="pallas", interpret=True)
    assert_fill_equal(got, want)


def test_ties_go_to_the_lower_slot():
    # Identical proposals: survival ties exactly across slots, so slot order decides.
    conf = np.full((3, 2), 0.5, np.float32)
    got = fill_reference(conf, np.full(3, 2, np.int32), np.ones(3, bool), num_rows=5)
    np.testing.assert_array_equal(got.lengths, [1, 1, 0])
    np.testing.assert_array_equal(got.row_slot, [0, 0, 1, 1, 2])
    np.testing.assert_array_equal(got.row_offset, [0, 1, 0, 1, 0])


def test_clamp_keeps_survival_decreasing():
    # conf >= 1 clamps to 0.99, so a slot's deeper rows never tie with its shallower ones and
    # a budget of 3 goes to slot 0's first two drafts (0.99, 0.9801) before slot 1's 0.98.
    conf = np.array([[1.0, 1.0, 1.0], [0.98, 0.0, 0.0]], np.float32)
    got = fill_reference(conf, np.array([3, 3]), np.ones(2, bool), num_rows=5)
    np.testing.assert_array_equal(got.lengths, [2, 1])


def check_invariants(result: FillResult, conf, proposal_len, active, num_rows, kept_by_rule):
    n, k = conf.shape
    r = FillResult(*(np.asarray(x) for x in result))
    plen = np.clip(proposal_len, 0, k)
    total = int(r.row_valid.sum())

    # Budget: all candidates or exactly B rows, whichever is fewer.
    candidates = int((active * (plen + 1)).sum())
    assert total == min(num_rows, candidates)
    assert int((r.lengths + 1)[r.slot_valid].sum()) == total
    np.testing.assert_array_equal(r.slot_valid, active)  # B >= active slots here
    assert np.all((0 <= r.lengths) & (r.lengths <= np.where(active, plen, 0)))

    # Layout: rows 0..total-1 are the slots' prefixes in slot order; the rest is padding.
    expect_slot, expect_offset = [], []
    for i in np.flatnonzero(r.slot_valid):
        assert r.row_start[i] == len(expect_slot)
        expect_slot += [i] * (r.lengths[i] + 1)
        expect_offset += list(range(r.lengths[i] + 1))
    np.testing.assert_array_equal(r.row_valid, np.arange(num_rows) < total)
    np.testing.assert_array_equal(r.row_slot, expect_slot + [n] * (num_rows - total))
    np.testing.assert_array_equal(r.row_offset, expect_offset + [0] * (num_rows - total))
    np.testing.assert_array_equal(r.row_start[~r.slot_valid], total)

    # Selection: exactly the global top-B by survival, ties to the lower flat index.
    kept = {(int(s), int(o)) for s, o in zip(r.row_slot[r.row_valid], r.row_offset[r.row_valid])}
    assert kept == kept_by_rule(conf, proposal_len, active, num_rows)


@st.composite
def fill_case(draw):
    n, k = draw(st.sampled_from([(1, 1), (3, 3), (8, 7), (5, 15)]))
    num_rows = draw(st.sampled_from(sorted({n, n + k, n * (k + 1), n * (k + 1) + 2})))
    conf = draw(
        st.lists(
            st.one_of(st.floats(0.0, 1.0, width=32), st.sampled_from([0.0, 0.5, 0.99, 1.0])),
            min_size=n * k,
            max_size=n * k,
        )
    )
    plen = draw(st.lists(st.integers(0, k), min_size=n, max_size=n))
    active = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    active = np.array(active)
    active[np.flatnonzero(active)[num_rows:]] = False  # precondition B >= active slots
    return np.array(conf, np.float32).reshape(n, k), np.array(plen, np.int32), active, num_rows


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=fill_case())
def test_reference_invariants(case, kept_by_rule):
    conf, plen, active, num_rows = case
    result = fill(conf, plen, active, num_rows=num_rows, impl="reference")
    check_invariants(result, conf, plen, active, num_rows, kept_by_rule)


@pytest.mark.parametrize("n,k,num_rows", [(3, 7, 13), (32, 15, 512)])
def test_reference_invariants_on_sweep_inputs(n, k, num_rows, fill_inputs, kept_by_rule):
    rng = np.random.default_rng(3)
    for regime in REGIMES:
        args = fill_inputs(rng, n, k, num_rows, regime)
        result = fill(*args, num_rows=num_rows, impl="reference")
        check_invariants(result, *args, num_rows, kept_by_rule)


def test_shape_errors_name_the_shapes():
    conf = jnp.zeros((4, 3))
    with pytest.raises(ValueError, match=r"\(4, 3\)"):
        fill(conf, jnp.zeros(5, jnp.int32), jnp.ones(4, bool), num_rows=4)
    with pytest.raises(ValueError, match=r"\(2, 16\)"):
        fill(jnp.zeros((2, 16)), jnp.zeros(2, jnp.int32), jnp.ones(2, bool), num_rows=4)
    with pytest.raises(ValueError, match="num_rows"):
        fill(conf, jnp.zeros(4, jnp.int32), jnp.ones(4, bool), num_rows=0)


def test_backend_selection():
    assert use_pallas("pallas") and not use_pallas("reference", interpret=True)
    assert use_pallas(None, interpret=True)
    assert use_pallas(None) == (__import__("jax").default_backend() == "gpu")
    with pytest.raises(ValueError, match="impl"):
        use_pallas("triton")


def test_reference_ops_override(monkeypatch):
    """LIGHTSPEC_REFERENCE_OPS sends the named ops to their reference; an explicit impl wins."""
    monkeypatch.setenv("LIGHTSPEC_REFERENCE_OPS", "fill, verify_attention")
    assert not use_pallas(None, interpret=True, op="fill")
    assert not use_pallas(None, interpret=True, op="verify_attention")
    assert use_pallas(None, interpret=True, op="verify")
    assert use_pallas("pallas", op="fill")
    monkeypatch.setenv("LIGHTSPEC_REFERENCE_OPS", "all")
    assert not any(use_pallas(None, interpret=True, op=op) for op in OPS)
    monkeypatch.setenv("LIGHTSPEC_REFERENCE_OPS", "fil")
    with pytest.raises(ValueError, match="fil"):
        use_pallas(None, op="fill")


def test_op_routes_retraces_and_restores(monkeypatch):
    """op_routes sets the route variables for the block and drops jax's caches on both sides:
    an op traced before would otherwise be reused whatever the variables say."""
    import os

    from lightspec_jax.pallas_kernels import KERNELS_ENV, op_routes

    monkeypatch.delenv(KERNELS_ENV, raising=False)
    args = (jnp.ones((4, 3)), jnp.full((4,), 3, jnp.int32), jnp.ones((4,), bool))

    def lowered():  # a fresh outer jit each time; fill's own trace is what may be reused
        return jax.jit(lambda *a: fill(*a, num_rows=6).row_slot).lower(*args).as_text()

    before = lowered()
    with op_routes(kernels="interpret"):
        assert os.environ[KERNELS_ENV] == "interpret"
        inside = lowered()  # the kernel, interpreted: another program
    assert KERNELS_ENV not in os.environ
    assert inside != before and lowered() == before
