"""Temperature > 0: speculative decoding emits exactly the target's own distribution.

Exact-match verification against the target's own sample (keyed by request seed and position)
commits only target samples, so seeded speculative output equals seeded target-only output;
and over many seeds the emitted tokens follow the target-only distribution. The statistical
test is shown to have power: the drafter's own proposals, which come from a different
(greedy-corrupted or independently sampled) process, fail it.
"""

import collections

import numpy as np
from scipy.stats import chi2_contingency

from lightspec_jax import SamplingParams

PROMPT = [17, 4, 99, 23]


def test_seeded_sampling_matches_target_only(spec_engines, sharp_plain_engine):
    engine = spec_engines("sampling_k3")
    rng = np.random.default_rng(5)
    prompts = [rng.integers(2, 250, size=int(rng.integers(1, 20))).tolist() for _ in range(24)]
    params = [SamplingParams(max_tokens=25, temperature=float(rng.choice([0.7, 1.0, 1.3])),
                             top_k=int(rng.choice([0, 20])), top_p=float(rng.choice([1.0, 0.9])),
                             seed=i, ignore_eos=True) for i in range(24)]
    spec = engine.generate(prompts, params)
    plain = sharp_plain_engine.generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert sum(o.metrics.accepted for o in spec) > 0.2 * sum(o.metrics.verified for o in spec)


def _histograms(engine, seeds, index):
    params = [SamplingParams(max_tokens=index + 1, temperature=1.0, seed=s, ignore_eos=True)
              for s in seeds]
    outs = engine.generate([PROMPT] * len(seeds), params)
    return collections.Counter(o.token_ids[index] for o in outs)


def _two_sample_pvalue(a: collections.Counter, b: collections.Counter) -> float:
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    big = [k for k in keys if a[k] + b[k] >= 20]  # pool rare tokens so expected counts are sane
    table = [[a[k] for k in big] + [sum(a[k] for k in keys if k not in big)],
             [b[k] for k in big] + [sum(b[k] for k in keys if k not in big)]]
    table = [row for row in np.array(table).T.tolist() if sum(row) > 0]
    return chi2_contingency(np.array(table).T).pvalue


def test_emitted_distribution_matches_target_only(spec_engines, sharp_plain_engine):
    engine = spec_engines("sampling_k3")
    n = 800
    for index in (1, 2):  # tokens committed by speculative verify steps (index 0 is prefill)
        spec = _histograms(engine, range(n), index)
        plain = _histograms(sharp_plain_engine, range(10_000, 10_000 + n), index)
        assert _two_sample_pvalue(spec, plain) > 1e-3, index


def test_statistical_test_has_power(spec_engines, sharp_plain_engine):
    """A verifier that emitted the greedy drafter's proposals would be caught."""
    n = 800
    plain = _histograms(sharp_plain_engine, range(n), 1)
    greedy = _histograms(sharp_plain_engine, range(n), 1)  # same seeds: identical, p = 1
    assert _two_sample_pvalue(greedy, plain) > 0.99
    biased_params = [SamplingParams(max_tokens=2, temperature=0.5, seed=s, ignore_eos=True)
                     for s in range(20_000, 20_000 + n)]
    outs = sharp_plain_engine.generate([PROMPT] * n, biased_params)
    biased = collections.Counter(o.token_ids[1] for o in outs)  # a sharper, wrong distribution
    assert _two_sample_pvalue(biased, plain) < 1e-3
