"""Bad requests fail at the call that made them and leave other requests untouched."""

import pytest

from lightspec_jax import RequestError, SamplingParams


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(seed=-3), "seed"),
    (dict(stop_token_ids=(-1,)), "stop_token_ids"),
])
def test_bad_sampling_values(kwargs, match):
    # RequestError: one except clause in a serving loop covers every bad user input.
    with pytest.raises(RequestError, match=match):
        SamplingParams(**kwargs)


def test_bad_requests_do_not_disturb_others(engine):
    good = SamplingParams(max_tokens=12, ignore_eos=True)
    ref, = engine.generate([[5, 6, 7]], good)
    engine.add_request("ok", [5, 6, 7], good)
    engine.step()  # "ok" is in flight while the bad calls arrive
    limit = engine.config.max_model_len
    cases = [
        (("empty", [], good), "empty prompt"),
        (("long", [3] * limit, good), "max_model_len"),
        (("vocab", [3, engine.vocab_size], good), "outside the vocabulary"),
        (("neg", [3, -1], good), "outside the vocabulary"),
        (("stop", [3], SamplingParams(stop_token_ids=(engine.vocab_size,))), "stop token id"),
        (("ok", [1, 2], good), "duplicate request id"),
        (("text", "hello", good), "tokenizer"),
        (("", [1], good), "request_id"),
        (("type", [1.5], good), "ints"),
    ]
    for args, match in cases:
        with pytest.raises(RequestError, match=match):
            engine.add_request(*args)
    with pytest.raises(RequestError, match="no unfinished request"):
        engine.abort("never-added")
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] = out
    assert set(outs) == {"ok"}
    assert outs["ok"].token_ids == ref.token_ids
    with pytest.raises(RequestError, match="no unfinished request"):
        engine.abort("ok")  # finished requests cannot be aborted either


def test_generate_validates_all_prompts_before_queueing(engine):
    with pytest.raises(RequestError, match="prompt 1: empty prompt"):
        engine.generate([[1, 2, 3], []], SamplingParams(max_tokens=4))
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
        engine.generate([[1]], [SamplingParams(), SamplingParams()])
    with pytest.raises(TypeError, match="list of prompts"):
        engine.generate([1, 2, 3])


def test_generate_refuses_a_busy_engine(engine):
    engine.add_request("busy", [4, 5], SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="idle engine"):
        engine.generate([[1]])
    while engine.has_unfinished_requests():
        engine.step()


def test_silent_misconfigurations_are_errors(engine, caplog):
    """A drafter the policy would ignore is refused; a max_model_len past the target's
    positions gets a warning; CheckpointError is importable from the top level."""
    import dataclasses
    import logging

    from lightspec_jax import CheckpointError, Engine
    from lightspec_jax.drafters import DraftLMDrafter

    with pytest.raises(ValueError, match="policy 'none'"):
        Engine(engine.model, config=engine.config, drafter=DraftLMDrafter(engine.model))
    assert issubclass(CheckpointError, Exception)
    long = dataclasses.replace(engine.config, max_num_seqs=1, max_num_batched_tokens=8,
                               row_buckets=(8,),
                               max_model_len=engine.model.config.max_position_embeddings + 1)
    with caplog.at_level(logging.WARNING, logger="lightspec_jax.engine.shapes"):
        Engine(engine.model, config=long)
    assert "max_position_embeddings" in caplog.text
