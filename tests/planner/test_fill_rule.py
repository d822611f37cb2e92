"""The survival fill rule (planner/fill.py) against its statement: hand-worked cases, then the
rule's invariants on random inputs. The device fill is checked against this module in
tests/pallas_kernels/test_fill.py.

Axis legend: N requests, K max draft depth.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightspec_jax.planner.fill import NO_DRAFT, fill_lengths, survival_scores


def test_survival_is_the_clipped_prefix_product():
    conf = np.array([[0.5, 1.0, 0.0], [np.nan, 0.5, 0.9]])
    got = survival_scores(conf, np.array([3, 2]))
    # 1.0 clips to 0.99 and 0.0 to 0.01; NaN counts as 0.01; row 1 proposed 2 drafts
    np.testing.assert_allclose(got[0], [0.5, 0.495, 0.00495])
    np.testing.assert_allclose(got[1, :2], [0.01, 0.005])
    assert got[1, 2] == NO_DRAFT


def test_proposal_lengths_outside_0_to_k_act_as_the_nearest_end():
    conf = np.full((3, 2), 0.5)
    got = survival_scores(conf, np.array([-1, 0, 5]))
    assert (got[:2] == NO_DRAFT).all()
    np.testing.assert_allclose(got[2], [0.5, 0.25])


def test_float32_scores_stay_float32():
    # The device ranks float32 products; the host rule must rank the same numbers.
    conf = np.random.default_rng(0).random((4, 5), dtype=np.float32)
    assert survival_scores(conf, np.full(4, 5)).dtype == np.float32
    assert survival_scores(conf.astype(np.float64), np.full(4, 5)).dtype == np.float64


def test_fill_takes_the_top_scores_as_prefixes():
    conf = np.array([[0.9, 0.9, 0.1], [0.5, 0.99, 0.99], [0.99, 0.99, 0.99]])
    plen = np.array([3, 3, 0])
    # survivals: r0 .9 .81 .081; r1 .5 .495 .49; r2 proposed nothing
    assert fill_lengths(conf, plen, 1).tolist() == [1, 0, 0]
    assert fill_lengths(conf, plen, 3).tolist() == [2, 1, 0]
    assert fill_lengths(conf, plen, 5).tolist() == [2, 3, 0]
    assert fill_lengths(conf, plen, 100).tolist() == [3, 3, 0]  # budget beyond every draft
    assert fill_lengths(conf, plen, 0).tolist() == [0, 0, 0]
    assert fill_lengths(conf, plen, -4).tolist() == [0, 0, 0]


def test_ties_go_to_the_lower_flat_index():
    conf = np.full((3, 2), 0.5)
    plen = np.full(3, 2)
    assert fill_lengths(conf, plen, 2).tolist() == [1, 1, 0]
    # the three .5 rows first, then the first .25 row: request 0's
    assert fill_lengths(conf, plen, 4).tolist() == [2, 1, 1]


def test_nan_ranks_last_not_first():
    conf = np.array([[np.nan, 0.9], [0.02, 0.9]])
    assert fill_lengths(conf, np.array([2, 2]), 1).tolist() == [0, 1]


def test_no_draft_positions_and_no_requests():
    assert fill_lengths(np.zeros((3, 0)), np.zeros(3, int), 5).tolist() == [0, 0, 0]
    assert fill_lengths(np.zeros((0, 4)), np.zeros(0, int), 5).tolist() == []


def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"\(4,\)"):
        fill_lengths(np.zeros((3, 2)), np.zeros(4, int), 1)
    with pytest.raises(ValueError, match=r"\(6,\)"):
        survival_scores(np.zeros(6), np.zeros(6, int))


CONF = st.one_of(st.floats(0.0, 1.0, width=32), st.just(float("nan")),
                 st.sampled_from([0.0, 0.005, 0.5, 0.99, 1.0]))


@st.composite
def cases(draw):
    n, k = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    conf = np.array(draw(st.lists(CONF, min_size=n * k, max_size=n * k)),
                    np.float32).reshape(n, k)
    plen = np.array(draw(st.lists(st.integers(-1, k + 1), min_size=n, max_size=n)))
    return conf, plen, draw(st.integers(-1, n * k + 2))


@settings(max_examples=200, deadline=None)
@given(case=cases())
def test_fill_invariants(case):
    conf, plen, budget = case
    scores = survival_scores(conf, plen)  # [N, K]
    lengths = fill_lengths(conf, plen, budget)  # [N]
    n, k = conf.shape
    proposed = np.clip(plen, 0, k)
    assert ((0 <= lengths) & (lengths <= proposed)).all()
    assert lengths.sum() == min(max(budget, 0), proposed.sum())
    # Scores strictly decrease along a proposal, so a selection by score is a prefix.
    for i in range(n):
        assert (np.diff(scores[i, :proposed[i]]) < 0).all()
    # Every kept row outranks every dropped one: a higher score, or the same and a lower
    # flat index.
    def rank(i, j):
        return scores[i, j], -(i * k + j)  # larger ranks first

    kept = [rank(i, j) for i in range(n) for j in range(lengths[i])]
    dropped = [rank(i, j) for i in range(n) for j in range(lengths[i], proposed[i])]
    if kept and dropped:
        assert min(kept) > max(dropped)
