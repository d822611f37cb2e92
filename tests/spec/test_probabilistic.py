"""Probabilistic verification (SpeculativeConfig(verification="probabilistic")) in the engine:
speculative rejection sampling emits exactly the target's distribution, accepts more than exact
match when the drafter's q resembles the target's p, and leaves greedy requests token for token.

The distribution tests have power: the same statistic rejects a deliberately wrong verifier
(one that redraws a rejected token from p instead of from norm(max(0, p - q))).

The rule itself and the proposal draws, on fixed p and q without an engine, are tested in
test_probabilistic_rule.py.
"""

import collections
import gc
import json
import os
import tempfile

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chi2_contingency, chisquare

from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from lightspec_jax.checkpoint import load_qwen3
from lightspec_jax.drafters import DraftLMDrafter, Eagle3Drafter
from lightspec_jax.engine.verifier import RejectionSampling
from lightspec_jax.planner import CostTable

from conftest import BASE, SIGNIFICANCE, random_eagle3
from dflash_fixtures import write_zlab_dflash

PROMPT = [17, 4, 99, 23]


def _mixed_requests(count, seed):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(2, 250, size=int(rng.integers(1, 20))).tolist() for _ in range(count)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 25)), seed=i, ignore_eos=True,
                             temperature=float(rng.choice([0.0, 0.7, 1.0])),
                             top_p=float(rng.choice([1.0, 0.9])), top_k=int(rng.choice([0, 8])))
              for i in range(count)]
    return prompts, params


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "ngram"])
def test_every_drafter_serves_probabilistic_verification(kind, target_dir, plain_engine,
                                                         tmp_path):
    """Eagle3 (a reduced draft vocabulary mapped to target ids), DFlash (a block drawn row by
    row) and n-gram lookup (point-mass drafts) under probabilistic verification: greedy
    requests stay token for token, sampled ones repeat under the static budget."""
    spec = SpeculativeConfig(policy="static", num_speculative_tokens=3,
                             verification="probabilistic", proposal_support=8,
                             method="ngram" if kind == "ngram" else None)
    # One verify and one prefill bucket: each sampling mode compiles its steps on first use.
    config = EngineConfig(max_num_seqs=6, verify_buckets=(24,), refresh_costs=False,
                          speculative=spec, **BASE)
    if kind == "dflash":
        cfg = load_qwen3(target_dir).config
        write_zlab_dflash(str(tmp_path), target_layers=cfg.num_layers,
                          vocab_size=cfg.vocab_size, block_size=5, mask_token_id=3, seed=5)
        engine = Engine.from_pretrained(target_dir, str(tmp_path), config=config)
    else:
        drafter = (Eagle3Drafter(random_eagle3(load_qwen3(target_dir).config))
                   if kind == "eagle3" else None)
        engine = Engine(load_qwen3(target_dir), config=config, drafter=drafter,
                        eos_token_ids=(1,))
    prompts, params = _mixed_requests(18, 6)
    try:
        first = [o.token_ids for o in engine.generate(prompts, params)]
        assert first == [o.token_ids for o in engine.generate(prompts, params)]
    finally:
        del engine
        gc.collect()  # its executables' code maps: the suite runs near the kernel's cap
    greedy = [i for i, p in enumerate(params) if p.greedy]
    plain = plain_engine.generate([prompts[i] for i in greedy], [params[i] for i in greedy])
    assert [first[i] for i in greedy] == [o.token_ids for o in plain]
    assert all(len(t) == p.max_tokens for t, p in zip(first, params))


class RedrawFromP(RejectionSampling):
    """A deliberately wrong verifier: a rejected draft is replaced by a draw from p."""

    def row_tokens(self, logits, state, layout, slot, row_pos, mode):
        right = super().row_tokens(logits, state, layout, slot, row_pos, mode)
        own = super(RejectionSampling, self).row_tokens(logits, state, layout, slot, row_pos,
                                                         mode)
        drafted = state.draft_tokens[slot, jnp.clip(row_pos - state.seq_len[slot], 0,
                                                    state.draft_tokens.shape[1] - 1)]
        return jnp.where(right == drafted, right, own)


def _flat_copy_drafter(target_dir, scale=0.3):
    """The target's copy with a flattened head: q resembles p but is broader, so about half
    of the drafts are rejected and the residual draw decides those tokens (what gives the
    distribution test its power against a wrong residual)."""
    model = load_qwen3(target_dir)
    model.lm_head.set_value(model.lm_head[...] * scale)
    return DraftLMDrafter(model, seed=7)


class _Engines:
    """Engines over the sharp target, built on first use and released when the tests that
    need them are done: XLA:CPU maps each executable's code into memory, and the whole suite
    in one process runs close to the kernel's cap on memory maps (conftest.py)."""

    def __init__(self, target_dir):
        self.target_dir = target_dir
        self.cache = {}

    def __call__(self, name):
        if name not in self.cache:
            self.cache[name] = self._build(name)
        return self.cache[name]

    def release(self, *names):
        for name in names:
            self.cache.pop(name, None)
        gc.collect()

    def _build(self, name):
        flat = name in ("flat", "wrong")
        exact = name in ("copy_exact", "copy_coupled")
        # Every engine on the same shapes: the copy engines then reuse the flat engine's
        # compiled prefill, verify and draft programs (the persistent cache: one program
        # text), where 16 slots of their own compiled a set of their own.
        slots = 32
        buckets = (slots, 2 * slots, 4 * slots)
        costs = {}
        if flat:
            # Fixed prices under which drafting pays: the draft model is the target's size,
            # so with measured ones the planner rightly sits at the floor, and too few tokens
            # would be decided by a draft's test to tell the wrong verifier apart.
            path = os.path.join(tempfile.mkdtemp(), "costs.json")
            with open(path, "w") as f:
                json.dump({"target": CostTable(dict(zip(buckets, (1.0, 1.3, 2.0)))).to_json(),
                           "draft": CostTable({b: 0.01 for b in buckets}).to_json()}, f)
            costs = dict(cost_table_path=path, refresh_costs=False)
        config = EngineConfig(
            max_num_seqs=slots, verify_buckets=buckets,
            speculative=SpeculativeConfig(
                policy="dynamic" if flat else "static", num_speculative_tokens=3,
                verification="exact" if exact else "probabilistic",
                coupled_drafts=name == "copy_coupled"),
            **costs, **BASE)
        drafter = (_flat_copy_drafter(self.target_dir) if flat else
                   DraftLMDrafter(load_qwen3(self.target_dir), seed=7))
        return Engine(load_qwen3(self.target_dir), config=config, drafter=drafter,
                      eos_token_ids=(1,), verifier=RedrawFromP(32) if name == "wrong" else None)


@pytest.fixture(scope="module")
def probabilistic_engines(sharp_checkpoint):
    """name -> engine over the sharp target: 'flat' (dynamic policy, flattened-copy drafter),
    'wrong' (the same with RedrawFromP), 'copy' / 'copy_exact' / 'copy_coupled' (static
    K = 3, an exact copy drafter; probabilistic, exact match with argmax drafts, exact match
    with coupled drafts)."""
    engines = _Engines(sharp_checkpoint[0])
    yield engines
    engines.release(*list(engines.cache))


def _two_sample_pvalue(a: collections.Counter, b: collections.Counter) -> float:
    """Chi-square homogeneity over 3-token sequences; rare ones pooled into one cell."""
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    big = [k for k in keys if a[k] + b[k] >= 20]
    table = np.array([[a[k] for k in big] + [sum(a[k] for k in keys if k not in big)],
                      [b[k] for k in big] + [sum(b[k] for k in keys if k not in big)]])
    return chi2_contingency(table[:, table.sum(axis=0) > 0]).pvalue


SETTINGS = {"T1": dict(temperature=1.0), "T0.7_top_p0.9": dict(temperature=0.7, top_p=0.9)}


def _target_probs(hf_model, prefixes, temperature, top_p=1.0):
    """The target's distribution of the next token after each prefix [G, L] -> [G, V], with
    the request's temperature and top-p (transformers' forward: independent of our code)."""
    import torch

    with torch.no_grad():
        logits = hf_model(torch.tensor(prefixes)).logits[:, -1].double().numpy()
    probs = np.exp(logits / temperature - (logits / temperature).max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    order = np.argsort(-probs, axis=1)
    sorted_probs = np.take_along_axis(probs, order, axis=1)
    keep_sorted = np.cumsum(sorted_probs, axis=1) - sorted_probs < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum(axis=1, keepdims=True)


def _conditional_pvalue(outs, hf_model, setting, index=2):
    """Goodness of fit of token `index` to the target's exact conditional distribution given
    the tokens before it: cells (prefix, token) with expected count n_prefix * p(token |
    prefix); cells expected below 5 pooled into one."""
    groups = collections.defaultdict(list)
    for o in outs:
        groups[tuple(o.token_ids[:index])].append(o.token_ids[index])
    prefixes = sorted(groups)
    probs = _target_probs(hf_model, [PROMPT + list(p) for p in prefixes], **SETTINGS[setting])
    observed, expected, rest_obs, rest_exp = [], [], 0, 0.0
    for prefix, row in zip(prefixes, probs):
        counts = np.bincount(groups[prefix], minlength=len(row))
        exp = len(groups[prefix]) * row
        big = exp >= 5
        observed += counts[big].tolist()
        expected += exp[big].tolist()
        rest_obs += int(counts[~big].sum())
        rest_exp += float(exp[~big].sum())
    observed, expected = np.array(observed + [rest_obs]), np.array(expected + [rest_exp])
    return chisquare(observed, expected * observed.sum() / expected.sum()).pvalue


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_emitted_distribution_matches_target_only(probabilistic_engines, sharp_plain_engine,
                                                  sharp_checkpoint, setting):
    """Over 2,000 seeds: the first 3 generated tokens follow target-only sampling (two-sample
    test), and the first token rejection sampling decides follows the target's exact
    conditional distribution, where a verifier that redraws rejections from p fails."""
    n = 2000
    params = lambda start: [SamplingParams(max_tokens=4, seed=s, ignore_eos=True,  # noqa: E731
                                           **SETTINGS[setting]) for s in range(start, start + n)]
    outs = probabilistic_engines("flat").generate([PROMPT] * n, params(0))
    plain = sharp_plain_engine.generate([PROMPT] * n, params(50_000))
    first_3 = lambda outs: collections.Counter(tuple(o.token_ids[:3]) for o in outs)  # noqa: E731
    assert _two_sample_pvalue(first_3(outs), first_3(plain)) > SIGNIFICANCE
    hf_model = sharp_checkpoint[1]
    assert _conditional_pvalue(plain, hf_model, setting) > SIGNIFICANCE  # the oracle itself
    # Token 0 comes from the prefill and token 1 from a step with no proposal yet (drafting
    # starts after the first verify): token 2 is the first that a draft's test decides (its
    # step may verify one draft: the allowance of 4 leaves room for it and the bonus).
    assert _conditional_pvalue(outs, hf_model, setting) > SIGNIFICANCE
    tested = sum(o.metrics.verified for o in outs)
    accepted = sum(o.metrics.accepted for o in outs)
    assert 0.2 * tested < accepted < 0.9 * tested  # rejections happen, and often
    wrong = probabilistic_engines("wrong").generate([PROMPT] * n, params(0))
    assert _conditional_pvalue(wrong, hf_model, setting) < SIGNIFICANCE


def test_greedy_requests_stay_exact(probabilistic_engines, sharp_plain_engine):
    """Greedy requests batched with sampled ones (dynamic budget, staggered lengths) emit
    plain greedy output token for token."""
    prompts, params = _mixed_requests(40, 3)
    spec = probabilistic_engines("flat").generate(prompts, params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    plain = sharp_plain_engine.generate([prompts[i] for i in greedy],
                                        [params[i] for i in greedy])
    assert [spec[i].token_ids for i in greedy] == [o.token_ids for o in plain]
    assert len(greedy) >= 5
    probabilistic_engines.release("flat", "wrong")  # the tests below use the copy engines


def test_accepts_more_than_exact_match(probabilistic_engines):
    """With q = p (the target's own copy drafting), rejection sampling accepts nearly every
    draft, and so does exact match with coupled drafts (drawn with the target's own noise),
    where argmax drafts are accepted only when the seeded sample hits the argmax."""
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=s, ignore_eos=True)
              for s in range(100)]
    rate = {}
    for name in ("copy", "copy_coupled", "copy_exact"):
        outs = probabilistic_engines(name).generate([PROMPT] * len(params), params)
        rate[name] = (sum(o.metrics.accepted for o in outs)
                      / sum(o.metrics.verified for o in outs))
    assert min(rate["copy"], rate["copy_coupled"]) > 0.95 > rate["copy_exact"] + 0.1
    probabilistic_engines.release("copy_exact")


def test_coupled_drafts_keep_plain_output(probabilistic_engines, sharp_plain_engine):
    """Coupled drafts change only what is proposed: exact match still commits the target's
    own tokens, so seeded sampled output is plain decoding's, token for token."""
    prompts, params = _mixed_requests(32, 8)
    spec = probabilistic_engines("copy_coupled").generate(prompts, params)
    plain = sharp_plain_engine.generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert sum(o.metrics.accepted for o in spec) > 0.5 * sum(o.metrics.verified for o in spec)


def test_static_budget_output_reproduces_alone_and_batched(probabilistic_engines):
    """With a budget that follows the proposal alone (the static policy verifies every
    draft), a seeded request's output depends on nothing else: served again, or alone
    instead of in a batch, it is the same. (A dynamic budget is planned from measured
    times, so its output is equally distributed but not repeatable token for token.)"""
    engine = probabilistic_engines("copy")
    prompts, params = _mixed_requests(24, 4)
    first = [o.token_ids for o in engine.generate(prompts, params)]
    assert first == [o.token_ids for o in engine.generate(prompts, params)]
    for i in (0, 5, 11):
        assert engine.generate([prompts[i]], [params[i]])[0].token_ids == first[i]


def test_configuration_errors(sharp_checkpoint):
    with pytest.raises(ValueError, match="synthetic_acceptance"):
        Engine(load_qwen3(sharp_checkpoint[0]), drafter=_flat_copy_drafter(sharp_checkpoint[0]),
               config=EngineConfig(synthetic_acceptance="chat", **BASE,
                                   speculative=SpeculativeConfig(
                                       policy="static", num_speculative_tokens=2,
                                       verification="probabilistic")))
    with pytest.raises(ValueError, match="verification"):
        SpeculativeConfig(policy="static", num_speculative_tokens=2, verification="lenient")
    with pytest.raises(ValueError, match="coupled_drafts"):
        SpeculativeConfig(policy="static", num_speculative_tokens=2,
                          verification="probabilistic", coupled_drafts=True)
    with pytest.raises(ValueError, match="proposal_support"):
        SpeculativeConfig(policy="static", num_speculative_tokens=2,
                          verification="probabilistic", proposal_support=0)
