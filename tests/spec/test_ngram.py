"""The n-gram (prompt lookup) drafter: its lookup, its learned confidence, and the engine's
method selection. Losslessness runs in test_lossless*.py (engine "ngram_k4")."""

import jax.numpy as jnp
import numpy as np
import pytest

from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from lightspec_jax.checkpoint import load_qwen3
from lightspec_jax.drafters import DraftRows, NgramDrafter

from conftest import BASE

S = 32  # cache length


def history(drafter, seqs):
    """A cache holding each slot's tokens but the last, which (like a bonus token) is passed
    to draft(); returns (cache, last_token [N], seq_len [N])."""
    n = len(seqs)
    cache = drafter.new_cache(num_slots=n, cache_len=S)
    token = np.concatenate([s[:-1] for s in seqs]).astype(np.int32)
    slot = np.concatenate([[i] * (len(s) - 1) for i, s in enumerate(seqs)]).astype(np.int32)
    pos = np.concatenate([np.arange(len(s) - 1) for s in seqs]).astype(np.int32)
    rows = DraftRows(token=jnp.asarray(token), next_token=jnp.asarray(token), hidden=None,
                     position=jnp.asarray(pos), slot=jnp.asarray(slot))
    cache = drafter.prefill([], cache, rows, target_embed=None)
    return (cache, jnp.asarray([s[-1] for s in seqs], jnp.int32),
            jnp.asarray([len(s) - 1 for s in seqs], jnp.int32))


def draft(drafter, cache, last, seq_len, depth=4, drafting=None):
    drafting = jnp.ones(last.shape, bool) if drafting is None else drafting
    return drafter.draft([], cache, last_token=last, seq_len=seq_len, drafting=drafting,
                         depth=depth, max_depth=6, target_embed=None)


def test_the_most_recent_longest_match_continues():
    d = NgramDrafter(min_n=1, max_n=3, shared=False)  # each slot's own tokens alone
    seqs = [[5, 6, 7, 8, 9, 5, 6, 7],  # "5 6 7" recurs: continue with 8 9 5 6 7 (known only)
            [1, 2, 3, 1, 2, 4, 1, 2],  # "1 2" twice: the later one (-> 4 1 2) wins
            [3, 9, 9, 9],  # self-overlapping repeats: 9 9 9 -> 9 (as far as known)
            [4, 5, 6, 7]]  # nothing recurs: no proposal
    cache, last, seq_len = history(d, seqs)
    _, prop = draft(d, cache, last, seq_len, depth=6)
    tokens, length = np.asarray(prop.tokens), np.asarray(prop.length)
    assert length.tolist() == [5, 3, 1, 0]
    assert tokens[0, :5].tolist() == [8, 9, 5, 6, 7]
    assert tokens[1, :3].tolist() == [4, 1, 2]
    assert tokens[2, :1].tolist() == [9]
    assert not np.asarray(prop.confidence)[3].any() and not tokens[3].any()


def test_depth_and_drafting_bound_the_proposal():
    d = NgramDrafter(min_n=2, max_n=2, shared=False)
    cache, last, seq_len = history(d, [[5, 6, 7, 8, 9, 5, 6]] * 2)
    _, prop = draft(d, cache, last, seq_len, depth=2, drafting=jnp.array([True, False]))
    assert np.asarray(prop.length).tolist() == [2, 0]
    assert np.asarray(prop.tokens)[0, :3].tolist() == [7, 8, 0]


def test_shared_lookup_continues_other_requests_tokens():
    """By default (`shared`), a size the slot's own history does not match is looked up in the
    other slots' histories before a shorter size: the latest window followed by a known
    token."""
    d = NgramDrafter(min_n=1, max_n=3)
    seqs = [[5, 6, 7, 8, 9, 5, 6, 7],  # own match "5 6 7" -> 8 9 5 6 7, as without sharing
            [1, 2, 3, 1, 2, 4, 1, 2],
            [4, 5, 6, 7],  # nothing of its own: slot 0's "5 6 7" (the one followed by 8)
            [6, 1, 5, 6]]  # a shared "5 6" (the latest: slot 2's) before its own "6" -> 1
    cache, last, seq_len = history(d, seqs)
    _, prop = draft(d, cache, last, seq_len, depth=6)
    tokens, length = np.asarray(prop.tokens), np.asarray(prop.length)
    assert length.tolist() == [5, 3, 5, 1]
    assert tokens[0, :5].tolist() == [8, 9, 5, 6, 7]
    assert tokens[1, :3].tolist() == [4, 1, 2]
    assert tokens[2, :5].tolist() == [8, 9, 5, 6, 7]
    assert tokens[3, :2].tolist() == [7, 0]  # slot 2 is known through its bonus token 7
    # Without sharing, slots 2 and 3 keep to their own tokens.
    own = NgramDrafter(min_n=1, max_n=3, shared=False)
    cache, last, seq_len = history(own, seqs)
    _, prop = draft(own, cache, last, seq_len, depth=6)
    assert np.asarray(prop.length).tolist() == [5, 3, 0, 3]
    assert np.asarray(prop.tokens)[3, :3].tolist() == [1, 5, 6]


def test_shared_lookup_keeps_each_slots_previous_request():
    """A prompt that takes a slot from position 0 keeps the slot's earlier requests (16 of
    them with one slot), and the new request's proposals can continue them."""
    d = NgramDrafter(min_n=2, max_n=2)
    cache = d.new_cache(num_slots=1, cache_len=S)

    def prompt(cache, tokens):
        rows = DraftRows(token=jnp.asarray(tokens, jnp.int32),
                         next_token=jnp.asarray(tokens, jnp.int32), hidden=None,
                         position=jnp.arange(len(tokens), dtype=jnp.int32),
                         slot=jnp.zeros(len(tokens), jnp.int32))
        return d.prefill([], cache, rows, target_embed=None)

    cache = prompt(cache, [11, 12, 13, 14, 15, 16])
    assert int(cache.length[0]) == 6 and not np.asarray(cache.previous_len).any()
    cache = prompt(cache, [30, 31, 32])
    cache = prompt(cache, [20, 13])  # a new request: "13 14" continues the first one's
    assert np.asarray(cache.previous_len)[0, :3].tolist() == [3, 6, 0]  # newest first
    assert int(cache.length[0]) == 2
    assert np.asarray(cache.previous)[0, 1, :6].tolist() == [11, 12, 13, 14, 15, 16]
    _, prop = draft(d, cache, jnp.asarray([14], jnp.int32), jnp.asarray([2], jnp.int32))
    assert np.asarray(prop.length).tolist() == [2]
    assert np.asarray(prop.tokens)[0, :2].tolist() == [15, 16]


def test_confidence_learns_the_hit_rate_of_each_match_length():
    d = NgramDrafter(min_n=1, max_n=2, decay=0.5, prior_hits=1.0, prior_trials=2.0)
    seq = [1, 2, 3, 4, 1, 2]  # "1 2" -> proposes 3 4 1 2
    cache, last, seq_len = history(d, [seq])
    cache, prop = draft(d, cache, last, seq_len)
    assert np.asarray(prop.tokens)[0, :4].tolist() == [3, 4, 1, 2]
    assert np.asarray(prop.confidence)[0, 0] == pytest.approx(0.5)  # the prior
    # The target agrees on 3 4, then says 9: two hits and a miss for 2-token matches.
    committed = [3, 4, 9]
    rows = DraftRows(token=jnp.asarray([2] + committed[:-1], jnp.int32),
                     next_token=jnp.asarray(committed, jnp.int32), hidden=None,
                     position=jnp.arange(5, 8, dtype=jnp.int32), slot=jnp.zeros(3, jnp.int32))
    cache = d.commit([], cache, rows, tail_row=jnp.asarray([2]), target_embed=None)
    cache, prop = draft(d, cache, jnp.asarray([9], jnp.int32), jnp.asarray([8], jnp.int32))
    hits, trials = np.asarray(cache.hits), np.asarray(cache.trials)
    assert hits[2] == pytest.approx(0.5 * 1.0 + 2) and trials[2] == pytest.approx(0.5 * 2 + 3)
    assert hits[1] == pytest.approx(1.0) and trials[1] == pytest.approx(2.0)  # untouched


def test_a_lookup_miss_counts_as_rejected_drafts():
    """What the planner learns from a depth-3 step (Readback.proposal_outcomes): with a drafter
    that may propose short, a request the draft run served with no match, or a short match
    verified whole, is an uncensored miss; one its allowance cut stays censored; a request
    admitted since the draft run (not `given`) teaches nothing. Model drafters: unchanged."""
    from lightspec_jax.engine.batch import Readback

    c = Readback(width=4)
    rows = np.zeros((5, c.columns), np.int32)
    # columns (offered, verified): full, short match, no match, cut by allowance, new request
    rows[:, [c.offered, c.verified]] = [[3, 3], [1, 1], [0, 0], [2, 1], [0, 0]]
    given = np.array([True, True, True, True, False])
    room = np.array([5, 5, 5, 1, 5])
    held, whole = c.proposal_outcomes(rows, 3, given=given, room=room, short_proposals=True)
    assert held.tolist() == [True, True, True, True, False]
    assert whole.tolist() == [True, True, True, False, True]  # (the last one is not held)
    held, whole = c.proposal_outcomes(rows, 3, given=given, room=room, short_proposals=False)
    assert held.tolist() == [True, True, False, True, False] and whole is None


def test_method_ngram_needs_no_drafter_and_speculates(spec_engines, plain_engine, target_dir):
    engine = spec_engines("ngram_k4")  # built from method="ngram", no drafter given
    assert isinstance(engine.drafter, NgramDrafter)
    assert engine.drafter.config[:2] == (1, 3)  # SpeculativeConfig's default n-gram sizes
    prompts = [[7, 8, 9, 10] * 6, [40, 41] * 8]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    want = [o.token_ids for o in plain_engine.generate(prompts, params)]
    assert [o.token_ids for o in engine.generate(prompts, params)] == want
    # That it speculates, on a fixed depth: the shared dynamic engine's choices follow what the
    # tests before this one taught it and the machine's timings (it may sit at the floor).
    static = Engine(load_qwen3(target_dir), config=EngineConfig(
        max_num_seqs=2, verify_buckets=(2, 4, 6, 8, 10), speculative=SpeculativeConfig(
            method="ngram", policy="static", num_speculative_tokens=4), **BASE))
    outs = static.generate(prompts, params)
    assert [o.token_ids for o in outs] == want
    assert sum(o.metrics.accepted for o in outs) > 0


def test_a_method_that_does_not_fit_the_drafter_is_an_error(target_dir):
    spec = SpeculativeConfig(policy="static", num_speculative_tokens=2, method="eagle3")
    with pytest.raises(ValueError, match="method 'eagle3'.*NgramDrafter"):
        Engine(load_qwen3(target_dir), config=EngineConfig(speculative=spec, **BASE),
               drafter=NgramDrafter())
    ngram = SpeculativeConfig(policy="static", num_speculative_tokens=2, method="ngram")
    with pytest.raises(ValueError, match="takes no drafter checkpoint"):
        Engine.from_pretrained(target_dir, target_dir, config=EngineConfig(speculative=ngram,
                                                                           **BASE))
    with pytest.raises(ValueError, match="unknown speculative method"):
        SpeculativeConfig(policy="static", num_speculative_tokens=2, method="medusa")
    with pytest.raises(ValueError, match="ngram_min <= ngram_max"):
        SpeculativeConfig(method="ngram", ngram_min=3, ngram_max=2)
    with pytest.raises(ValueError, match="ngram_shared must be a bool or None"):
        SpeculativeConfig(method="ngram", ngram_shared="yes")


def test_shared_lookup_by_default_with_exact_verification_alone():
    """Probabilistic verification's sampled output follows the drafts, so by default its
    n-gram drafter keeps to each request's own tokens: the same requests, alone or batched,
    give the same output again."""
    def shares(**kw):
        return SpeculativeConfig(method="ngram", policy="static", num_speculative_tokens=2,
                                 **kw).shares_ngrams
    assert shares() and not shares(verification="probabilistic")
    assert shares(verification="probabilistic", ngram_shared=True)
    assert not shares(ngram_shared=False)
