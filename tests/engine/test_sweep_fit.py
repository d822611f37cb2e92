"""The sweep's prices: each bucket timed once per round, so a slow spell of the machine hits
every bucket alike; the verify prices fitted so more rows never cost less, and the depth prices
(differences of two noisy timings) so a deeper draft never costs less than a shallower one (or
than nothing)."""

from types import SimpleNamespace

import numpy as np

from lightspec_jax.engine import costs


def _fake_runner(sizes, max_depth, floor_buckets=frozenset()):
    """What profile_costs reads of a runner, with the timing itself faked by the test."""
    registry = SimpleNamespace(sizes=sizes, pick=lambda n: sizes[0])
    return SimpleNamespace(decode_registry=registry, num_slots=4, max_depth=max_depth,
                           cache_len=256, empty_state=lambda: None, place_state=lambda s: s,
                           floor_buckets=floor_buckets, discard_catch_up=lambda: None)


def test_depth_prices_never_fall_with_depth(monkeypatch):
    # Timed (depth 0, depth d) pairs at the home bucket: d = 2 and d = 4 came out cheap.
    added = {1: 0.68, 2: 0.52, 3: 0.96, 4: 0.46, 5: 1.20, 6: -0.1}

    def fake_time(runner, rows, variants, *, context, count):
        if len(variants) == 1:
            return [10.0]
        return [10.0, 10.0 + added[variants[1][0]]]

    monkeypatch.setattr(costs, "_time_round", fake_time)
    runner = _fake_runner((4, 8, 16), max_depth=6)
    profile = costs.profile_costs(runner, depths=tuple(added), show_progress=False)
    prices = [profile.draft_depth_ms[d] for d in sorted(added)]
    assert np.all(np.diff(prices) >= 0) and min(prices) > 0
    # Least squares: pooled neighbours take their mean, the rest keep their timing.
    # (0.96, 0.46) pool to 0.71, which then exceeds the pool (1.20, -0.1) = 0.55: all four
    # pool to 0.63.
    np.testing.assert_allclose(prices, [0.60, 0.60, 0.63, 0.63, 0.63, 0.63])
    assert profile.target.estimate(8) == 10.0


def test_verify_table_follows_the_attention_route(monkeypatch):
    """The CPU's reference attention reads a request's KV once per row: a context column's
    added time scales with the bucket. Measured at a longer context only at the large bucket
    (what a speculating engine sees), the one-row-per-request bucket must scale with it, not
    take the large bucket's added milliseconds."""
    monkeypatch.setattr(costs, "_time_round",
                        lambda runner, rows, variants, **kw: [float(rows)] * len(variants))
    runner = _fake_runner((4, 8, 12), max_depth=2)
    target = costs.profile_costs(runner, depths=(1, 2), show_progress=False).target
    assert target.impute == costs.verify_context_rule() == "scale"  # the CPU backend
    longer = 3 * 4 * 64
    target.update(12, 24.0, longer)  # the 12-row bucket took twice its sweep time there
    assert target.estimate(4, longer) == 8.0  # scaled; a shift would have given 4 + 12 = 16


def test_a_drafter_that_catches_up_has_its_commit_priced_as_drafting(monkeypatch):
    """At the floor buckets (a draft LM's, runner.floor_buckets) a step that drafts nothing
    only records its rows: the verify table holds that step, and the draft table (what a
    drafting step adds at B) the committing step less it. Larger buckets always commit."""
    commit_ms = {4: 1.5, 8: 2.5}

    def fake_time(runner, rows, variants, **kw):
        assert all(not d for d, _ in variants) or variants == ((0, True), (variants[1][0], True))
        return [10.0 * rows + (commit_ms[rows] if commit and not depth and len(variants) == 2
                               and not variants[1][1] else 0.0) + depth
                for depth, commit in variants]

    monkeypatch.setattr(costs, "_time_round", fake_time)
    runner = _fake_runner((4, 8, 16), max_depth=2, floor_buckets=frozenset({4, 8}))
    profile = costs.profile_costs(runner, depths=(1, 2), show_progress=False)
    assert [profile.target.estimate(b) for b in (4, 8, 16)] == [40.0, 80.0, 160.0]
    np.testing.assert_allclose([profile.draft.estimate(b) for b in (4, 8)], [1.5, 2.5])
    assert profile.draft.estimate(16) < 0.01  # placeholder: its steps commit at every depth
    assert profile.draft_depth_ms == {1: 1.0, 2: 2.0}


def test_verify_prices_never_fall_with_rows(monkeypatch):
    """A bucket timed under a smaller one (a spell of the machine during the smaller one's
    timing) is pooled with it, least squares: the table holds no step the device lacks."""
    timed = {4: 3.0, 6: 5.4, 8: 4.6, 12: 7.0, 16: 8.5, 24: 16.8, 32: 13.2}
    monkeypatch.setattr(costs, "_time_round",
                        lambda runner, rows, variants, **kw: [timed[rows]] * len(variants))
    runner = _fake_runner(tuple(timed), max_depth=2)
    target = costs.profile_costs(runner, depths=(1, 2), show_progress=False).target
    prices = [target.estimate(b) for b in timed]
    np.testing.assert_allclose(prices, [3.0, 5.0, 5.0, 7.0, 8.5, 15.0, 15.0])


def test_every_bucket_is_timed_once_per_round_and_priced_by_its_fastest(monkeypatch):
    """Round-robin over the buckets and depths, a warm-up round of one step first; each price
    is the fastest of its rounds, wherever in the sweep that round fell."""
    calls = []
    slow = {4: 9.0, 9: 9.0}  # call index -> its ms: bucket 8 in round 1, bucket 4 in round 3

    def fake_time(runner, rows, variants, *, context, count):
        calls.append((rows, count))
        return [slow.get(len(calls) - 1, float(rows)) + d for d, _ in variants]

    monkeypatch.setattr(costs, "_time_round", fake_time)
    runner = _fake_runner((4, 8), max_depth=1)
    profile = costs.profile_costs(runner, depths=(1,), show_progress=False, repeats=3)
    items = [4, 8, 4]  # the two buckets, then depth 1 at the home bucket (4)
    assert calls == [(r, 1) for r in items] + [(r, 4) for r in items] * 3
    assert [profile.target.estimate(b) for b in (4, 8)] == [4.0, 8.0]
    assert profile.draft_depth_ms == {1: 1.0}
