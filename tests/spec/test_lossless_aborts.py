"""Lossless under churn: aborts mid-flight, staggered arrivals, chunked prefill, greedy and
seeded sampling mixed, with step i+1 dispatched before step i is read (overlap) and without.

Every request that is not aborted emits exactly the target-only output; an aborted one emits
a prefix of it; every request is reported finished exactly once; every slot comes back.
"""

import contextlib
import dataclasses

import numpy as np
import pytest

from lightspec_jax import SamplingParams

# engine name -> (reference engine fixture, sampled requests too)
CASES = {"copy_k3": ("plain_engine", False), "eagle3_k5": ("plain_engine", False),
         "dynamic_k4": ("plain_engine", False), "sampling_k3": ("sharp_plain_engine", True),
         "copy_k5_c32": ("plain_engine", False), "ngram_k4": ("plain_engine", True)}


@contextlib.contextmanager
def overlap(engine, on: bool):
    """The loop reads `config.overlap` each step, so a shared engine can run both ways."""
    saved = engine.config
    engine.config = dataclasses.replace(saved, overlap=on)
    try:
        yield engine
    finally:
        engine.config = saved


def scenario(rng, engine, sampled: bool):
    n = int(rng.integers(2, int(engine.config.max_num_seqs * 1.5) + 3))
    out = []
    for i in range(n):
        prompt = rng.integers(2, engine.vocab_size, size=int(rng.integers(1, 45))).tolist()
        temperature = float(rng.choice([0.0, 1.0])) if sampled else 0.0
        params = SamplingParams(max_tokens=int(rng.integers(1, 28)), temperature=temperature,
                                top_k=int(rng.choice([0, 20])), seed=int(rng.integers(1 << 20)),
                                ignore_eos=bool(rng.random() < 0.5))
        arrive = int(rng.integers(0, 10))
        abort_at = arrive + int(rng.integers(0, 8)) if rng.random() < 0.3 else None
        out.append((f"a{i}", prompt, params, arrive, abort_at))
    return out


def serve(engine, requests):
    pending = sorted(requests, key=lambda r: r[3])
    aborts = {r[0]: r[4] for r in requests if r[4] is not None}
    outputs, step = {}, 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][3] <= step:
            rid, prompt, params, _, _ = pending.pop(0)
            engine.add_request(rid, prompt, params)
        for rid, at in list(aborts.items()):
            if at <= step:
                del aborts[rid]
                if rid in engine._requests and not engine._requests[rid].finished:
                    engine.abort(rid)
        for out in engine.step():
            if out.finished:
                assert out.request_id not in outputs, f"{out.request_id} finished twice"
                outputs[out.request_id] = out
        step += 1
    return outputs


@pytest.mark.parametrize("overlapped", [True, False], ids=["overlap", "serial"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_aborts_and_churn_stay_lossless(name, overlapped, spec_engines, request):
    reference_engine = request.getfixturevalue(CASES[name][0])
    sampled = CASES[name][1]
    rng = np.random.default_rng(sum(map(ord, name)) + overlapped)
    with overlap(spec_engines(name), overlapped) as engine:
        check_churn(engine, reference_engine, rng, cases=6, sampled=sampled, label=name)


def check_churn(engine, reference_engine, rng, *, cases: int, sampled: bool, label: str):
    """`cases` random scenarios (staggered arrivals, aborts mid-flight) served by `engine`:
    every request ends, finished ones equal the reference engine's output, aborted ones a
    prefix of it, and every slot is free again."""
    for case in range(cases):
        requests = scenario(rng, engine, sampled)
        outputs = serve(engine, requests)
        assert set(outputs) == {r[0] for r in requests}, f"case {case}: lost requests"
        wants = reference_engine.generate([r[1] for r in requests], [r[2] for r in requests])
        for (rid, *_), want in zip(requests, wants):
            got = outputs[rid]
            if got.finish_reason == "abort":
                assert got.token_ids == want.token_ids[:len(got.token_ids)], (case, rid)
            else:
                assert got.token_ids == want.token_ids, (label, case, rid)
                assert got.finish_reason == want.finish_reason, (label, case, rid)
        assert not engine.scheduler.running and not engine.scheduler.waiting
        assert len(engine.scheduler._free_slots) == engine.config.max_num_seqs


def test_plain_decoding_overlaps_and_stays_exact(plain_engine):
    """Plain decoding is the runner without a drafter, with the same overlap: its output does
    not depend on whether step i is read before step i+1 is dispatched."""
    rng = np.random.default_rng(3)
    requests = scenario(rng, plain_engine, sampled=True)
    requests = [(rid, p, params, arrive, None) for rid, p, params, arrive, _ in requests]
    with overlap(plain_engine, True):
        on = serve(plain_engine, requests)
    with overlap(plain_engine, False):
        off = serve(plain_engine, requests)
    assert {r: o.token_ids for r, o in on.items()} == {r: o.token_ids for r, o in off.items()}
