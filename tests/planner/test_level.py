"""The batch's acceptance level (planner/level.py) and how the statistics use it."""

import numpy as np
import pytest

from lightspec_jax.planner import AcceptanceStats
from lightspec_jax.planner.level import LevelShift, outcomes

POOLED = np.array([0.0, 0.8, 0.6, 0.45, 0.3, 0.2])  # s[0] unused, K = 5


def test_off_and_zero_offset_leave_the_curve_alone():
    assert LevelShift(rho=0.9, variance=0.0).apply(POOLED) is POOLED
    off = LevelShift(rho=0.9, variance=0.0)
    off.update(POOLED, np.array([6, 6, 6]), 5)
    assert off.delta == 0.0 and off.var == 0.0
    assert LevelShift(rho=0.9, variance=0.5).apply(POOLED) is POOLED


@pytest.mark.parametrize("accept, sign", [(6, 1), (1, -1)])
def test_outcomes_move_the_level_their_way(accept, sign):
    level = LevelShift(rho=0.95, variance=0.5)
    for _ in range(5):
        level.update(POOLED, np.array([accept]), 5)
    assert np.sign(level.delta) == sign
    moved = level.apply(POOLED)
    assert (np.sign(moved[1:] - POOLED[1:]) == sign).all()
    assert (np.diff(moved[1:]) <= 0).all() and ((moved[1:] > 0) & (moved[1:] < 1)).all()


def test_outcomes_at_the_pooled_level_keep_it_near_zero():
    rng = np.random.default_rng(0)
    a = POOLED[1:] / np.concatenate([[1.0], POOLED[1:-1]])  # conditional acceptance
    level = LevelShift(rho=0.95, variance=0.5)
    deltas = []
    for _ in range(400):
        survive = np.cumprod(rng.random((4, 5)) < a, axis=1)  # [N, d]
        level.update(POOLED, 1 + survive.sum(axis=1), 5)
        deltas.append(level.delta)
    assert abs(np.mean(deltas[50:])) < 0.15


def test_spread_shrinks_with_the_batch():
    """A batch of N requests: its mean level spreads as variance / N, so a big batch's offset
    stays small even after a lucky step."""
    small, big = LevelShift(rho=0.95, variance=0.5), LevelShift(rho=0.95, variance=0.5)
    small.update(POOLED, np.full(1, 6), 5)
    big.update(POOLED, np.full(256, 6), 5)
    assert big.var < small.var / 50


def test_admission_forgets_in_proportion():
    level = LevelShift(rho=0.95, variance=0.5)
    for _ in range(10):
        level.update(POOLED, np.array([6, 6]), 5)
    before = level.delta
    level.admit(1, 2)
    assert level.delta == pytest.approx(before / 2)
    level.admit(2, 2)
    assert level.delta == 0.0 and level.var == pytest.approx(0.25)


def test_unmeasured_depths_keep_their_pull():
    level = LevelShift(rho=0.95, variance=0.5)
    level.delta = -1.0
    curve = np.array([0.0, 0.8, 0.6, 1.0, 1.0])  # depths 3-4 never measured
    moved = level.apply(curve)
    assert moved[3] == 1.0 and moved[4] == 1.0 and moved[2] < 0.6


def _stats(variance):
    return AcceptanceStats(max_depth=5, sample_floor=16, level_variance=variance)


def test_stats_follow_a_good_request_at_batch_one():
    """One request that accepts everything, after a pooled history of middling acceptance:
    the level-aware estimate of a deep full-width step rises toward it, the pooled one barely."""
    rng = np.random.default_rng(1)
    stats = {v: _stats(v) for v in (0.0, 0.5)}
    step = 0
    for _ in range(200):  # middling history, one request per step
        accept = 1 + np.cumprod(rng.random((1, 5)) < 0.6, axis=1).sum(axis=1)  # [1]
        for s in stats.values():
            s.record(num_requests=1, fill_rows=6, depth=5, accept_lens=accept, verify_lens=None,
                     step=step)
        step += 1
    stats[0.5].admit(1, 1)
    for _ in range(6):  # the new request accepts everything
        for s in stats.values():
            s.record(num_requests=1, fill_rows=6, depth=5, accept_lens=np.array([6]),
                     verify_lens=None, step=step)
        step += 1
    pooled = stats[0.0].progress(1, 6, 5, now=step)
    level = stats[0.5].progress(1, 6, 5, now=step)
    assert level > pooled + 0.05


def test_key_emas_move_with_the_level():
    """An exact key's EMA is a pooled figure: the level shifts it as it shifts the fill."""
    stats = _stats(0.5)
    for step in range(40):
        stats.record(num_requests=1, fill_rows=6, depth=5, accept_lens=np.array([2 + step % 4]),
                     verify_lens=None, step=step)
        stats.record(num_requests=1, fill_rows=3, depth=5, accept_lens=np.array([2]),
                     verify_lens=np.array([3]), step=step, full_width=False)
    baseline = stats.progress(1, 3, 5, now=40)
    stats.level.delta = 1.5
    stats.curves._filled = None  # the shifted curve is cached until the level moves
    assert stats.progress(1, 3, 5, now=40) > baseline


def test_outcomes_count_each_position_reached_and_passed():
    """outcomes() is the [N, d] comparison it replaces: position j was reached (verified) by
    the requests with accept >= j and passed (accepted) by those with accept > j."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        depth = int(rng.integers(1, 9))
        accept = rng.integers(1, depth + 2, size=int(rng.integers(0, 40))).astype(np.float64)
        j = np.arange(1, depth + 1)
        reached, passed = outcomes(accept, depth)
        np.testing.assert_array_equal(reached, (accept[:, None] >= j).sum(axis=0))
        np.testing.assert_array_equal(passed, (accept[:, None] > j).sum(axis=0))
