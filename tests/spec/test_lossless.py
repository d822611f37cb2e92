"""The first invariant: greedy speculative output == greedy target-only output, always.

Randomised serving scenarios (request counts up to the slot count and beyond, prompt lengths,
max_tokens and stop tokens that land inside accepted spans, requests joining and finishing
mid-flight) run through the step API on speculative engines and are compared token for token
with the plain engine, whose equality with transformers is tested in tests/engine.
"""

import numpy as np
import pytest

from lightspec_jax import SamplingParams

CASES_PER_ENGINE = {"copy_k3": 60, "copy_k11": 45, "copy_k5_c32": 40, "random_k1": 30,
                    "eagle3_k5": 30, "dynamic_k4": 40, "dspark_k3": 25, "ngram_k4": 30,
                    "dynamic_k4_admit3": 25}


def references(plain_engine, requests):
    """The plain engine's (tokens, finish reason) for each (prompt, params), served together."""
    outs = plain_engine.generate([prompt for prompt, _ in requests],
                                 [params for _, params in requests])
    return [(out.token_ids, out.finish_reason) for out in outs]


def random_scenario(rng, engine, plain_engine):
    slots = engine.config.max_num_seqs
    n = int(rng.integers(1, int(slots * 1.5) + 2))
    vocab = engine.vocab_size
    drawn = []
    for i in range(n):
        prompt = rng.integers(2, vocab, size=int(rng.integers(1, 40))).tolist()
        max_tokens = int(rng.integers(1, 30))
        # Stop on a token the target will emit, often mid-span: the stop is the token at
        # `stop_at` of its ignore_eos output, which has exactly max_tokens tokens.
        stop_at = int(rng.integers(0, max_tokens)) if rng.random() < 0.4 else None
        ignore_eos = bool(rng.random() < 0.5)
        drawn.append((f"r{i}", prompt, max_tokens, stop_at, ignore_eos,
                      int(rng.integers(0, 12))))  # arrival step
    stopping = [d for d in drawn if d[3] is not None]
    full = references(plain_engine, [(d[1], SamplingParams(max_tokens=d[2], ignore_eos=True))
                                     for d in stopping])
    stop_token = {d[0]: int(tokens[d[3]]) for d, (tokens, _) in zip(stopping, full)}
    return [(rid, prompt, SamplingParams(max_tokens=max_tokens,
                                         stop_token_ids=((stop_token[rid],) if rid in stop_token
                                                         else ()),
                                         ignore_eos=ignore_eos), arrive)
            for rid, prompt, max_tokens, _, ignore_eos, arrive in drawn]


def serve(engine, requests):
    pending = sorted(requests, key=lambda r: r[3])
    outputs, step = {}, 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][3] <= step:
            rid, prompt, params, _ = pending.pop(0)
            engine.add_request(rid, prompt, params)
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
        step += 1
    return outputs


@pytest.mark.parametrize("name", sorted(CASES_PER_ENGINE))
def test_greedy_speculative_equals_target_only(name, spec_engines, plain_engine):
    check_random_scenarios(spec_engines(name), plain_engine, CASES_PER_ENGINE[name], name)


def check_random_scenarios(engine, plain_engine, cases, name):
    """`cases` random scenarios (seeded by `name`) served by `engine` emit, request by
    request, the plain engine's tokens and finish reasons."""
    rng = np.random.default_rng(sum(map(ord, name)))
    for case in range(cases):
        requests = random_scenario(rng, engine, plain_engine)
        outputs = serve(engine, requests)
        wants = references(plain_engine, [(prompt, params) for _, prompt, params, _ in requests])
        for (rid, *_), (want, reason) in zip(requests, wants):
            got = outputs[rid]
            assert got.token_ids == want, f"{name} case {case} request {rid}"
            assert got.finish_reason == reason, f"{name} case {case} request {rid}"


def test_spans_really_are_speculative(spec_engines, plain_engine):
    """The copy drafter accepts long spans, fully, with bonus tokens; the random one rarely."""
    prompts = [[5, 9, 17, 33], [200, 3], [42] * 12]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    k11 = spec_engines("copy_k11")
    outs = k11.generate(prompts, params)
    m = [o.metrics for o in outs]
    assert sum(x.accepted for x in m) / sum(x.verified for x in m) > 0.35
    assert max(s.accepted for s in k11.stats.steps) >= 11 * 2  # full acceptance on several slots
    assert all(x.acceptance_length > 2 for x in m)
    rnd = spec_engines("random_k1")
    outs = rnd.generate(prompts, params)
    assert sum(o.metrics.accepted for o in outs) <= 0.2 * sum(o.metrics.verified for o in outs)


def test_visits_to_the_floor_stay_lossless(spec_engines, plain_engine, monkeypatch):
    """Floor visits (a step that stops drafting, then floor steps that only record the rows
    for the draft LM) and the steps that leave them (the drafter's catch-up, then a draft)
    under random arrivals, stops and ends: the plain engine's tokens, request by request.
    Every other fresh decision visits the floor here, and the others draft: the planner's own
    depth, or the deepest where it priced the floor best. (Whichever it prices best depends
    on what earlier tests taught this shared engine's tables: after some, the floor.)"""
    engine = spec_engines("dynamic_k4")
    planner = engine.planner
    deepest = planner.spec.draft_depths[-1]
    turns = iter(range(10**9))
    monkeypatch.setattr(planner, "_rival", lambda depth, best_j:
                        0 if next(turns) % 2 else (None if depth else deepest))
    seen = {"visit": 0, "leave": 0}

    def observer(e):
        if e.plan is not None and e.record.num_requests:
            seen["visit"] += e.plan.reason == "visit"
            seen["leave"] += e.plan.verified_depth == 0 and e.plan.draft_depth > 0
    engine.add_step_observer(observer)
    try:
        check_random_scenarios(engine, plain_engine, 25, "floor visits")
    finally:
        engine.remove_step_observer(observer)
    assert seen["visit"] >= 10 and seen["leave"] >= 10, seen  # not vacuous
