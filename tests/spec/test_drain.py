"""A step in flight that may end every request it decodes is read before the next step is
dispatched (Engine._may_drain): no decode step is spent on finished requests alone, and the
next prompts start a step earlier. Ends at the allowance are foreseeable; these requests have
no other (ignore_eos, no stop ids)."""

import pytest

from lightspec_jax import SamplingParams


def _serve(engine, prompts, params):
    before = max((r.index for r in engine.step_records()), default=0)
    outs = engine.generate(prompts, params)
    return outs, [r for r in engine.step_records() if r.index > before]


@pytest.mark.parametrize("name", [None, "copy_k3", "dynamic_k4"])
def test_no_decode_step_runs_on_finished_requests_alone(name, spec_engines, plain_engine):
    engine = plain_engine if name is None else spec_engines(name)
    slots = engine.config.max_num_seqs
    # Two full waves of equal requests: plain decoding ends each wave in one step, a
    # speculative engine wherever acceptance takes each request.
    prompts = [[3 + i % 5, 7, 11 + i % 3, 2] for i in range(2 * slots)]
    params = [SamplingParams(max_tokens=6, ignore_eos=True)] * len(prompts)
    outs, records = _serve(engine, prompts, params)
    assert [len(o.token_ids) for o in outs] == [6] * len(prompts)  # nothing lost
    wasted = [r.index for r in records if r.verify_rows and r.num_requests == 0]
    assert wasted == []
    assert any(r.prefill_rows for r in records[1:])  # the second wave came in after the first


def test_draining_changes_no_token(plain_engine):
    """The same requests served with the drain rule and without it (every step overlapped)
    give the same tokens."""
    engine = plain_engine
    prompts = [[5, 9, 2], [4, 4, 8, 1], [6], [2, 3]] * 3
    params = [SamplingParams(max_tokens=2 + i % 4, ignore_eos=True) for i in range(len(prompts))]
    drained, _ = _serve(engine, prompts, params)
    engine._may_drain = lambda: False  # the instance attribute shadows the method
    try:
        overlapped, records = _serve(engine, prompts, params)
    finally:
        del engine._may_drain
    assert [o.token_ids for o in drained] == [o.token_ids for o in overlapped]
    # ... and without the rule a wave's end does cost a step on finished requests
    assert any(r.verify_rows and r.num_requests == 0 for r in records)
