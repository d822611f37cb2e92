"""benchmarks/sweep_stability.py: its "per-bucket" sweep is the engine's sweep in the order
before rounds - each bucket's repeats back to back, no fit - and leaves the engine's as it was."""

from types import SimpleNamespace

from benchmark_scripts import load_benchmark

from lightspec_jax.engine import costs


def test_per_bucket_sweep_times_each_bucket_through_and_fits_nothing(monkeypatch):
    bench = load_benchmark("sweep_stability")
    calls = []
    timed = {4: 5.0, 8: 4.0}  # 8 rows timed under 4: kept as timed, not pooled

    def fake_time(runner, rows, variants, *, context, count):
        calls.append((rows, count))
        return [timed[rows] + d for d, _ in variants]

    monkeypatch.setattr(costs, "_time_round", fake_time)
    registry = SimpleNamespace(sizes=(4, 8), pick=lambda n: 4)
    runner = SimpleNamespace(decode_registry=registry, num_slots=4, max_depth=1, cache_len=256,
                             empty_state=lambda: None, place_state=lambda s: s,
                             floor_buckets=frozenset(), discard_catch_up=lambda: None)
    profile = bench.per_bucket_sweep(costs, runner, (1,))
    assert calls == [(4, 1)] + [(4, 4)] * 3 + [(8, 1)] + [(8, 4)] * 3 + [(4, 1)] + [(4, 4)] * 3
    assert [profile.target.estimate(b) for b in (4, 8)] == [5.0, 4.0]
    assert costs.non_decreasing([2.0, 1.0]) == [1.5, 1.5]  # the engine's fit is back
    assert costs._time_rounds.__name__ == "_time_rounds"
