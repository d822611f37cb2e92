"""Acceptance statistics: one sample per step, survival fill, weights, staleness."""

import numpy as np
import pytest

from lightspec_jax.planner import AcceptanceStats


def record(stats, n, u, d, accept, step=0, verify_lens=None):
    stats.record(num_requests=n, fill_rows=u, depth=d, accept_lens=np.array(accept),
                 verify_lens=verify_lens, step=step)


def test_progress_sample_is_committed_tokens_per_verified_row():
    # §13.8: [2, 2] at (2,4,1) -> 1.0; [1, 1] at (2,4,3) -> 0.5; each with count 1
    stats = AcceptanceStats(max_depth=3)
    record(stats, 2, 4, 1, [2, 2])
    record(stats, 2, 4, 3, [1, 1])
    assert stats.entry(2, 4, 1) == (1.0, 1)
    assert stats.entry(2, 4, 3) == (0.5, 1)


def test_one_update_per_step_whatever_the_batch_size():
    # §13.8: 128 requests at (128,128,1) -> count 1
    stats = AcceptanceStats(max_depth=1)
    record(stats, 128, 128, 1, [1] * 128)
    assert stats.entry(128, 128, 1)[1] == 1


def test_no_statistics_means_progress_one():
    stats = AcceptanceStats(max_depth=3)
    assert not stats.has_progress and not stats.has_survival
    assert stats.progress(2, 8, 3, now=0) == 1.0


def test_survival_fill_values():
    # §13.9: after [2, 1] at (2,8,3): (2,4,3) -> 0.75, (2,2,3) -> 1.0, (2,4,2) -> 0.75
    stats = AcceptanceStats(max_depth=3)
    record(stats, 2, 8, 3, [2, 1])
    assert stats.survival[1:].tolist() == [0.5, 0.0, 0.0]
    assert stats.progress(2, 4, 3, now=0) == pytest.approx(0.75)
    assert stats.progress(2, 2, 3, now=0) == pytest.approx(1.0)
    assert stats.progress(2, 4, 2, now=0) == pytest.approx(0.75)
    # after [4, 2] instead: (2,6,2) -> 5/6
    fresh = AcceptanceStats(max_depth=3)
    record(fresh, 2, 8, 3, [4, 2])
    assert fresh.progress(2, 6, 2, now=0) == pytest.approx(5 / 6)


def test_depths_past_the_measured_ones_continue_its_conditional_acceptance():
    """LightLLM counts an unmeasured depth as 1.0; a deeper depth cannot survive more often
    than a shallower one, so ours continue the last measured conditional acceptance."""
    stats = AcceptanceStats(max_depth=4)
    record(stats, 2, 4, 1, [2, 1])  # full width at depth 1: survival[1] = 0.5 only
    assert np.isnan(stats.survival[2])
    # (2, 6, 2): 2 target rows + 2 rows at depth 1 (0.5 each) + 2 at depth 2 (0.5 * 0.5 each)
    assert stats.progress(2, 6, 2, now=0) == pytest.approx((2 + 1 + 0.5) / 6)
    record(stats, 2, 8, 3, [4, 2])  # depths 1-3 measured; depth 4 follows s[3] / s[2]
    s, _ = stats.curves.levels()
    assert s[4] == pytest.approx(s[3] * s[3] / s[2])
    assert np.all(np.diff(s[1:]) <= 1e-12)


def test_nothing_measured_prices_every_depth_as_surviving():
    stats = AcceptanceStats(max_depth=3)
    record(stats, 2, 5, 3, [4, 1])  # trimmed: no survival sample
    assert stats.progress(2, 8, 3, now=0) == pytest.approx(1.0)


def test_survival_is_updated_only_by_full_width_steps():
    stats = AcceptanceStats(max_depth=3)
    record(stats, 2, 5, 3, [4, 1])  # trimmed: 5 < 2 * 4 rows
    assert not stats.has_survival
    assert stats.entry(2, 5, 3) == (1.0, 1)


def test_uncensored_requests_count_their_missing_drafts_as_rejected():
    """A short proposal verified whole (a lookup drafter that found 1 token, or none, at
    depth 3) is a miss at the depths it did not draft when `uncensored` says so; by default
    (verify_lens < d + 1) it is censored and the survival sees only the full proposal."""
    accept, verify = np.array([4, 2, 1]), np.array([4, 2, 1])  # depth 3: full, 1 draft, none
    censored = AcceptanceStats(max_depth=3)
    censored.record(num_requests=3, fill_rows=12, depth=3, accept_lens=accept,
                    verify_lens=verify, step=0, full_width=True)
    counted = AcceptanceStats(max_depth=3)
    counted.record(num_requests=3, fill_rows=12, depth=3, accept_lens=accept,
                   verify_lens=verify, step=0, full_width=True,
                   uncensored=np.array([True, True, True]))
    np.testing.assert_allclose(censored.survival[1:], [1.0, 1.0, 1.0])
    np.testing.assert_allclose(counted.survival[1:], [2 / 3, 1 / 3, 1 / 3])


def test_young_average_is_a_mean_then_an_ema():
    stats = AcceptanceStats(max_depth=1, progress_decay=0.9)
    record(stats, 16, 32, 1, [1] * 16)  # 0.5
    record(stats, 16, 32, 1, [2] * 16)  # 1.0
    assert stats.entry(16, 32, 1)[0] == pytest.approx(0.75)  # mean of the first samples
    for _ in range(20):
        record(stats, 16, 32, 1, [1] * 16)
    before = stats.entry(16, 32, 1)[0]
    record(stats, 16, 32, 1, [2] * 16)
    assert stats.entry(16, 32, 1)[0] == pytest.approx(0.9 * before + 0.1 * 1.0)


def test_small_batches_move_estimates_less():
    def settled(n, sample_floor):
        stats = AcceptanceStats(max_depth=1, sample_floor=sample_floor)
        for _ in range(200):
            record(stats, n, 2 * n, 1, [1] * n)
        record(stats, n, 2 * n, 1, [2] * n)
        return stats.survival[1]

    assert settled(1, sample_floor=16) == pytest.approx(0.1 / 16)
    assert settled(16, sample_floor=16) == pytest.approx(0.1)
    assert settled(1, sample_floor=1) == pytest.approx(0.1)  # LightLLM's rule


def test_stale_entries_fade_toward_the_survival_fill():
    stats = AcceptanceStats(max_depth=2, half_life=100)
    record(stats, 2, 4, 1, [1, 1], step=0)  # survival[1] = 0 -> fill for (2,3,1) = 2/3
    record(stats, 2, 3, 1, [2, 1], step=0)  # EMA for (2,3,1) = 1.0
    assert stats.progress(2, 3, 1, now=0) == pytest.approx(1.0)
    assert stats.progress(2, 3, 1, now=100) == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3)
    assert stats.progress(2, 3, 1, now=10**6) == pytest.approx(2 / 3)


def test_full_width_keys_can_use_the_survival_fill():
    exact = AcceptanceStats(max_depth=2, full_width_from_survival=True)
    legacy = AcceptanceStats(max_depth=2)
    for stats in (exact, legacy):
        record(stats, 1, 3, 2, [3])  # (1,3,2): progress 1.0, survival 1, 1
        record(stats, 1, 2, 1, [1])  # survival[1] -> mean(1, 0) = 0.5
    assert legacy.progress(1, 3, 2, now=0) == pytest.approx(1.0)  # its own (old) EMA
    # survival EMAs (0.5, 1.0) are not a survival curve; the fill pools them by weight
    # (2 steps, 1 step) into the non-increasing (2/3, 2/3)
    assert exact.progress(1, 3, 2, now=0) == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)


def test_fill_uses_a_non_increasing_survival_curve():
    stats = AcceptanceStats(max_depth=3)
    record(stats, 2, 8, 3, [4, 4])  # survival 1, 1, 1 (weight 1 each)
    for _ in range(3):
        record(stats, 2, 6, 2, [1, 2])  # depths 1-2 only: s1 -> 0.625, s2 -> 0.25
    assert stats.survival[1:].tolist() == pytest.approx([0.625, 0.25, 1.0])  # raw EMAs
    # s3 (weight 1) > s2 (weight 4): pooled to (4 * 0.25 + 1 * 1.0) / 5 = 0.4 each
    s, _ = stats.curves.levels()
    assert s[1:].tolist() == pytest.approx([0.625, 0.4, 0.4])
    assert stats.progress(2, 7, 3, now=0) == pytest.approx((2 + 2 * (0.625 + 0.4) + 0.4) / 7)
    # an already non-increasing curve is left alone
    fresh = AcceptanceStats(max_depth=3)
    record(fresh, 2, 8, 3, [4, 2])
    assert fresh.curves.levels()[0][1:].tolist() == fresh.survival[1:].tolist() == [1.0, 0.5, 0.5]


def test_interpolation_estimator_is_linear_in_fractional_draft_rows():
    stats = AcceptanceStats(max_depth=2, estimator="interpolate")
    record(stats, 2, 6, 2, [3, 2])  # ratios: r1 = 1, r2 = mean(min(2,2), min(1,2)) / 2 = 0.75
    assert stats.ratio[1:].tolist() == [1.0, 0.75]
    # A(1) = 1, A(2) = 1.5; u = 5 -> s = 1.5 draft rows per request -> A = 1.25
    assert stats.progress(2, 5, 2, now=0) == pytest.approx((2 + 2 * 1.25) / 5)
    # the exact key is blended with the interpolation by sample count (1 of 10)
    blended = 0.1 * (5 / 6) + 0.9 * ((2 + 2 * 1.5) / 6)
    assert stats.progress(2, 6, 2, now=0) == pytest.approx(blended)


def test_invalid_configuration_is_rejected():
    with pytest.raises(ValueError, match="estimator"):
        AcceptanceStats(max_depth=2, estimator="magic")
    with pytest.raises(ValueError, match="decay"):
        AcceptanceStats(max_depth=2, progress_decay=1.0)


def test_sampling_classes_keep_separate_statistics():
    """Greedy requests that accept everything and sampled ones that accept nothing, in
    alternating batches: each class's estimate stays its own, and a mixed batch is priced by
    its composition. One pooled estimate would put both near the middle."""
    stats = AcceptanceStats(max_depth=3, sample_floor=1, full_width_from_survival=True)
    greedy, hot = np.zeros(4, int), np.full(4, 5)
    for step in range(20):
        classes = greedy if step % 2 else hot
        accept = np.full(4, 4) if step % 2 else np.ones(4, int)
        stats.record(num_requests=4, fill_rows=16, depth=3, accept_lens=accept,
                     verify_lens=np.full(4, 4), step=step, classes=classes)
    stats.set_batch(greedy)
    assert stats.progress(4, 16, 3, now=20) == pytest.approx(1.0)
    stats.set_batch(hot)
    assert stats.progress(4, 16, 3, now=20) == pytest.approx(0.25)
    stats.set_batch(np.array([0, 0, 5, 5]))
    assert stats.progress(4, 16, 3, now=20) == pytest.approx((4 + 2 * 3) / 16)
    pooled = AcceptanceStats(max_depth=3, sample_floor=1, full_width_from_survival=True)
    for step in range(20):  # the same steps without classes: one estimate, in between
        accept = np.full(4, 4) if step % 2 else np.ones(4, int)
        pooled.record(num_requests=4, fill_rows=16, depth=3, accept_lens=accept,
                      verify_lens=np.full(4, 4), step=step)
    assert 0.3 < pooled.progress(4, 16, 3, now=20) < 0.95


def test_the_only_class_seen_shares_the_pooled_curve_until_another_arrives():
    """While every sample comes from one class, that class's curve is the pooled one (kept
    once); when a second class, or a sample without classes, arrives it gets its own. Either
    way each class's curve is exactly the one fed by its samples alone."""
    rng = np.random.default_rng(5)
    for trial in range(30):
        stats = AcceptanceStats(max_depth=4, sample_floor=1, level_variance=0.5)
        alone: dict[int, AcceptanceStats] = {}  # class -> statistics fed its samples alone
        first_class = int(rng.integers(0, 3))
        for step in range(int(rng.integers(1, 25))):
            n, d = int(rng.integers(1, 6)), int(rng.integers(1, 5))
            accept = rng.integers(1, d + 2, size=n)
            mixed = step > 8 and rng.random() < 0.5
            classes = (rng.integers(0, 3, size=n) if mixed else np.full(n, first_class))
            without = step > 8 and rng.random() < 0.1
            stats.record(num_requests=n, fill_rows=n * (d + 1), depth=d, accept_lens=accept,
                         verify_lens=np.full(n, d + 1), step=step,
                         classes=None if without else classes)
            if without:
                continue
            for c in np.unique(classes).tolist():
                mine = classes == c
                alone.setdefault(c, AcceptanceStats(max_depth=4, sample_floor=1)).record(
                    num_requests=int(mine.sum()), fill_rows=int(mine.sum()) * (d + 1),
                    depth=d, accept_lens=accept[mine], verify_lens=np.full(mine.sum(), d + 1),
                    step=step)
        for c, own in alone.items():
            assert stats.curves.has_class(c)
            np.testing.assert_array_equal(stats.curves.class_fit(c),
                                          own.curves.fit(own.curves.pooled, own.curves.weights))
