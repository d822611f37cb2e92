"""EngineConfig.admission_interval: while requests decode, waiting requests enter free slots
at most once every `admission_interval` steps; with nothing decoding, at once. Host only: the
scheduler alone, no device step (the lossless tests serve through such an engine:
tests/spec/conftest.py, "dynamic_k4_admit3")."""

import pytest

from lightspec_jax import EngineConfig, SamplingParams
from lightspec_jax.engine.scheduler import Scheduler
from lightspec_jax.request import FinishReason, Request


def admitted_at(interval: int, ends: dict[int, tuple[int, ...]], slots: int = 2) -> list:
    """`slots` slots, two more waiting requests of one-chunk prompts than slots; `ends`:
    step -> slots whose request ends before that step is scheduled. The step each request
    was admitted at (None: not in 10 steps)."""
    scheduler = Scheduler(num_slots=slots, max_rows=64, admission_interval=interval)
    requests = [Request(request_id=f"r{i}", prompt_token_ids=[5, 6, 7],
                        params=SamplingParams(max_tokens=8), seed=0, stop_ids=frozenset(),
                        allowance=8) for i in range(slots + 2)]
    for request in requests:
        scheduler.add(request)
    at = [None] * len(requests)
    for step in range(10):
        for slot in ends.get(step, ()):
            scheduler.finish(scheduler.running[slot], FinishReason.LENGTH)
        scheduler.schedule()
        for i, request in enumerate(requests):
            if at[i] is None and request.slot is not None:
                at[i] = step
    return at


def test_every_step_by_default():
    assert admitted_at(1, {1: (0,), 4: (1,)}) == [0, 0, 1, 4]


def test_at_most_once_every_interval_while_others_decode():
    # A slot freed at step 1 waits for step 3, one freed at step 4 for step 6.
    assert admitted_at(3, {1: (0,), 4: (1,)}) == [0, 0, 3, 6]
    # Two slots freed between windows (a third still decoding) are filled in one admission.
    assert admitted_at(3, {1: (0,), 2: (1,)}, slots=3) == [0, 0, 0, 3, 3]


def test_at_once_when_nothing_decodes():
    assert admitted_at(3, {1: (0, 1)}) == [0, 0, 1, 1]


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_config_rejects_a_non_positive_interval(bad):
    with pytest.raises(ValueError, match="admission_interval"):
        EngineConfig(admission_interval=bad)
