"""Greedy output of the engine == transformers generate(do_sample=False), token for token."""

import numpy as np
import pytest
import torch

from lightspec_jax import SamplingParams
from lightspec_jax.request import Request


def hf_greedy(hf_model, prompt, max_new_tokens):
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def random_prompts(seed, lengths, vocab):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, size=n).tolist() for n in lengths]


@pytest.mark.parametrize("name", ["untied_sharded", "tied_single"])
def test_generate_matches_transformers(engines, name):
    engine, hf_model = engines[name]
    # More prompts than slots and longer than one step's row budget: queueing, chunked prefill
    # and decodes interleave.
    prompts = random_prompts(0, [1, 7, 30, 13, 50, 3, 22, 9], engine.vocab_size)
    outs = engine.generate(prompts, SamplingParams(max_tokens=34, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.prompt_token_ids == prompt
        assert out.token_ids == hf_greedy(hf_model, prompt, 34)
        assert out.finished and out.finish_reason == "length"


def test_stop_token_and_max_model_len(engine, engines):
    _, hf_model = engines["untied_sharded"]
    prompt = random_prompts(1, [10], engine.vocab_size)[0]
    ref = hf_greedy(hf_model, prompt, 40)
    stop = ref[6]
    first = ref.index(stop)
    out, = engine.generate([prompt], SamplingParams(max_tokens=40, stop_token_ids=(stop,)))
    assert out.token_ids == ref[:first + 1] and out.finish_reason == "stop"
    # max_model_len caps prompt + output.
    long_prompt = random_prompts(2, [90], engine.vocab_size)[0]
    out, = engine.generate([long_prompt], SamplingParams(max_tokens=40, ignore_eos=True))
    assert len(out.token_ids) == engine.config.max_model_len - 90
    assert out.finish_reason == "length"
    assert out.token_ids == hf_greedy(hf_model, long_prompt, 6)


def test_step_api_with_arrivals_and_aborts(engine, engines):
    _, hf_model = engines["untied_sharded"]
    vocab = engine.vocab_size
    prompts = dict(zip("abcdefghij", random_prompts(3, [5, 17, 2, 40, 8, 11, 3, 26, 6, 14], vocab)))
    max_tokens = {rid: 20 + 3 * i for i, rid in enumerate(prompts)}
    arrivals = {0: "abc", 2: "d", 3: "ef", 7: "g", 12: "hij"}
    aborts = {5: "b", 13: "j", 15: "h"}  # j aborts one step after arriving (still waiting/prefilling)
    streamed = {rid: [] for rid in prompts}
    finished = {}
    step = 0
    while step <= max(arrivals) or engine.has_unfinished_requests():
        for rid in arrivals.get(step, ""):
            engine.add_request(rid, prompts[rid], SamplingParams(max_tokens=max_tokens[rid],
                                                                 ignore_eos=True))
        for rid in aborts.get(step, ""):
            engine.abort(rid)
        for out in engine.step():
            assert out.request_id not in finished, "reported after finishing"
            streamed[out.request_id] += out.new_token_ids
            assert out.token_ids == streamed[out.request_id]
            if out.finished:
                finished[out.request_id] = out
        step += 1
    assert set(finished) == set(prompts)
    for rid, prompt in prompts.items():
        ref = hf_greedy(hf_model, prompt, max_tokens[rid])
        out = finished[rid]
        if rid in "bhj":
            assert out.finish_reason == "abort"
            assert out.token_ids == ref[:len(out.token_ids)]
        else:
            assert out.finish_reason == "length" and out.token_ids == ref, rid


def test_generate_reports_each_request_once_as_a_step_loop_ends_it(engine, monkeypatch):
    """generate() returns finished requests only, so it builds no report for the others on
    the way (hundreds a step at high concurrency): one report per request, carrying its whole
    output, the same tokens and finish reasons as a step() loop and the same token count in
    the engine's stats."""
    prompts = random_prompts(4, [5, 19, 3, 12], engine.vocab_size)
    params = [SamplingParams(max_tokens=6 + 5 * i, ignore_eos=True) for i in range(4)]
    reports = []
    report = Request.report
    monkeypatch.setattr(Request, "report",
                        lambda self, metrics: reports.append(self.request_id)
                        or report(self, metrics))
    before = engine.stats.tokens
    outs = engine.generate(prompts, params)
    assert sorted(reports) == sorted(o.request_id for o in outs)  # one each, at its end
    assert [o.new_token_ids for o in outs] == [o.token_ids for o in outs]
    assert engine.stats.tokens - before == sum(len(o.token_ids) for o in outs)
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"stepped-{i}", prompt, p)
    stepped, before = {}, engine.stats.tokens
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                stepped[out.request_id] = out
    assert [(o.token_ids, o.finish_reason) for o in outs] == [
        (stepped[f"stepped-{i}"].token_ids, stepped[f"stepped-{i}"].finish_reason)
        for i in range(len(prompts))]
    assert engine.stats.tokens - before == sum(len(o.token_ids) for o in outs)
    assert len(reports) > 2 * len(prompts)  # step() reported the requests on the way


def test_a_removed_step_observer_is_called_no_more(engine):
    seen = []

    def observer(event):
        seen.append(event.record.index)

    params = SamplingParams(max_tokens=3, ignore_eos=True)
    engine.add_step_observer(observer)
    engine.generate([[5, 6, 7]], params)
    called = len(seen)
    assert called > 0
    engine.remove_step_observer(observer)
    engine.generate([[5, 6, 7]], params)
    assert len(seen) == called
    with pytest.raises(ValueError):
        engine.remove_step_observer(observer)
