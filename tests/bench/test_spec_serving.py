"""benchmarks/spec_serving.py's steady-state throughput (QueueWatch): counted only while
requests waited for a slot, so a finite run's drain does not weigh on it. Host only."""

import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _watch(waiting_by_step, emitted_by_step, seconds_by_step):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from spec_serving import QueueWatch
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    engine = types.SimpleNamespace(scheduler=types.SimpleNamespace(waiting=[]))
    watch = QueueWatch(engine, start=0.0)
    clock = iter(seconds_by_step)
    for waiting, emitted in zip(waiting_by_step, emitted_by_step):
        engine.scheduler.waiting = [None] * waiting
        watch(types.SimpleNamespace(record=types.SimpleNamespace(emitted=emitted)))
        # the mark's time, as perf_counter would have given it
        watch.marks[-1] = (next(clock),) + watch.marks[-1][1:]
    return watch


def test_steady_window_ends_at_the_last_step_read_with_requests_waiting():
    # Four steps with a queue, then a drain of three steps with few tokens each.
    watch = _watch([5, 3, 2, 1, 0, 0, 0], [8, 8, 8, 8, 2, 1, 1],
                   [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    steady = watch.steady()
    assert steady["steady_tokens"] == 32
    assert abs(steady["steady_s"] - 0.4) < 1e-12
    assert abs(steady["steady_tok_s"] - 80.0) < 1e-9  # the drain (4 tokens in 0.3 s) left out


def test_no_step_with_a_queue_gives_no_steady_figure():
    steady = _watch([0, 0], [4, 4], [0.1, 0.2]).steady()
    assert steady == {"steady_tok_s": None, "steady_s": 0.0, "steady_tokens": 0}
