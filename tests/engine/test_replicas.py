"""Data-parallel replicas on the host (engine/scheduler.py): each of D replicas verifies B / D
rows of its own N / D slots, so requests go to the least-loaded replica and the verify bucket
is sized by the busiest one. Host only: the device side is checked in mesh_check.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from lightspec_jax import SamplingParams
from lightspec_jax.engine.scheduler import (Scheduler, replica_loads, rows_needed,
                                            spread_slots)
from lightspec_jax.request import FinishReason, Request


def _request(i: int) -> Request:
    return Request(request_id=f"r{i}", prompt_token_ids=[1, 2, 3],
                   params=SamplingParams(max_tokens=4), seed=i, stop_ids=frozenset(),
                   allowance=4)


@given(replicas=st.sampled_from([1, 2, 4]), per=st.integers(1, 6), data=st.data())
def test_spread_slots_and_rows_needed(replicas, per, data):
    n = replicas * per
    count = data.draw(st.integers(0, n))
    taken = spread_slots(n, replicas, count)
    loads = replica_loads(taken, replicas)
    assert taken.sum() == count and loads.max() - loads.min() <= 1
    if replicas == 1:
        assert taken.tolist() == [s < count for s in range(n)]
    # Every marked slot gets its row on its replica, and no fewer rows would do.
    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    need = rows_needed(np.array(mask), replicas)
    assert need % replicas == 0 and need >= sum(mask)
    assert need // replicas == max(replica_loads(np.array(mask), replicas))


@settings(max_examples=60, deadline=None)
@given(replicas=st.sampled_from([1, 2, 4]), per=st.integers(1, 4),
       events=st.lists(st.tuples(st.booleans(), st.integers(0, 63)), max_size=40))
def test_admission_goes_to_the_least_loaded_replica(replicas, per, events):
    """Whatever arrives and finishes, a new request takes the lowest free slot of a replica
    that holds the fewest requests; an empty scheduler fills slots in `spread_slots` order."""
    n = replicas * per
    sched = Scheduler(num_slots=n, max_rows=64, replicas=replicas)
    held = lambda: replica_loads([r is not None for r in sched.owner], replicas)  # noqa: E731
    made = 0
    for arrive, pick in events:
        free = [s for s in range(n) if sched.owner[s] is None]
        if free and (arrive or not sched.running):
            before = held()
            request = _request(made)
            made += 1
            sched.add(request)
            sched.schedule()
            lightest = min(before[s // per] for s in free)
            assert before[request.slot // per] == lightest
            assert request.slot == min(s for s in free if before[s // per] == lightest)
        elif sched.running:
            slots = sorted(sched.running)
            sched.finish(sched.running[slots[pick % len(slots)]], FinishReason.ABORT)
    fresh = Scheduler(num_slots=n, max_rows=64, replicas=replicas)
    for i in range(n):
        fresh.add(_request(i))
        fresh.schedule()
        taken = np.array([r is not None for r in fresh.owner])
        assert (taken == spread_slots(n, replicas, i + 1)).all()
