"""Sampling on the device: masks, seeds, and the statistical match to softmax(logits / T)."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

from lightspec_jax import SamplingParams
from lightspec_jax.sampling import filter_logits, sample


def kept_reference(logits, top_k, top_p):
    """The kept token set by definition: top-k by value, then the smallest most-likely-first
    prefix of the renormalised distribution whose mass reaches top_p; tokens tied with a
    threshold value are kept (a symmetric choice; transformers breaks such ties by sort order)."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    if 0 < top_k < len(logits):
        kth = logits[order[top_k - 1]]
        order = [i for i in order if logits[i] >= kth]
    z = np.exp(np.array([logits[i] for i in order]) - logits[order[0]])
    probs = z / z.sum()
    kept, mass = [], 0.0
    for i, p in zip(order, probs):
        if kept and mass >= top_p - 1e-6:
            break
        kept.append(i)
        mass += p
    return {i for i in order if logits[i] >= logits[kept[-1]]}


def test_hand_examples():
    logits = jnp.array([[3.0, 2.0, 1.0, 0.0]] * 4)
    top_k = jnp.array([2, 0, 0, 1])
    top_p = jnp.array([1.0, 0.5, 0.7, 1.0])  # probs ~ [0.64, 0.24, 0.09, 0.03]
    kept = np.isfinite(np.asarray(filter_logits(logits, top_k, top_p)))
    assert kept.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]]


@pytest.mark.parametrize("seed", range(5))
def test_filter_matches_definition(seed):
    rng = np.random.default_rng(seed)
    rows, vocab = 64, 12
    logits = rng.normal(size=(rows, vocab)).round(1) * 2  # rounding makes ties
    top_k = rng.integers(0, vocab + 2, size=rows)
    top_p = rng.choice([1.0, 0.9, 0.5, 0.2, 0.01], size=rows)
    out = np.asarray(filter_logits(jnp.asarray(logits, jnp.float32), jnp.asarray(top_k, jnp.int32),
                                   jnp.asarray(top_p, jnp.float32)))
    for r in range(rows):
        kept = set(np.flatnonzero(np.isfinite(out[r])).tolist())
        assert kept == kept_reference(logits[r].tolist(), int(top_k[r]), float(top_p[r])), r
        np.testing.assert_array_equal(out[r][list(kept)], logits[r][list(kept)].astype(np.float32))


def _draw(logits_row, n, temperature=1.0, top_k=0, top_p=1.0, seed=0):
    logits = jnp.tile(jnp.asarray(logits_row, jnp.float32)[None], (n, 1))
    full = lambda v, dt: jnp.full((n,), v, dt)  # noqa: E731
    return np.asarray(sample(logits, full(temperature, jnp.float32), full(top_k, jnp.int32),
                             full(top_p, jnp.float32), full(seed, jnp.uint32),
                             jnp.arange(n, dtype=jnp.int32)))


LOGITS = np.array([1.0, 0.2, -0.5, 2.0, 0.0, -1.5, 1.2, 0.6])


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0),
                                                       (1.0, 3, 1.0), (1.0, 0, 0.8)])
def test_distribution_matches_softmax(temperature, top_k, top_p):
    n = 20000
    draws = _draw(LOGITS, n, temperature, top_k, top_p)
    kept = sorted(kept_reference((LOGITS / temperature).tolist(), top_k, top_p))
    assert set(np.unique(draws)) <= set(kept)
    z = np.exp(LOGITS[kept] / temperature)
    expected = z / z.sum() * n
    observed = np.array([(draws == k).sum() for k in kept])
    assert chisquare(observed, expected).pvalue > 1e-4


def test_statistical_test_has_power():
    """The same test rejects a sampler drawn at the wrong temperature."""
    n = 20000
    draws = _draw(LOGITS, n, temperature=1.3)
    z = np.exp(LOGITS)
    observed = np.array([(draws == k).sum() for k in range(len(LOGITS))])
    assert chisquare(observed, z / z.sum() * n).pvalue < 1e-4


def test_greedy_is_argmax_and_seeds_reproduce():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(16, 50)), jnp.float32)
    zeros = jnp.zeros((16,))
    ints = jnp.zeros((16,), jnp.int32)
    greedy = sample(logits, zeros, ints, jnp.ones((16,)), ints.astype(jnp.uint32), ints)
    np.testing.assert_array_equal(np.asarray(greedy), np.argmax(np.asarray(logits), -1))
    a = _draw(LOGITS, 200, seed=11)
    assert (a == _draw(LOGITS, 200, seed=11)).all()
    assert (a != _draw(LOGITS, 200, seed=12)).any()


def test_seeded_requests_reproduce_whatever_the_batch(engine):
    params = SamplingParams(max_tokens=24, temperature=1.0, top_k=40, top_p=0.95, seed=1234,
                            ignore_eos=True)
    prompt = [9, 8, 7, 6]
    alone, = engine.generate([prompt], params)
    others = [[5] * 30, [2, 3], [77] * 11]
    mixed = engine.generate(
        [others[0], prompt, others[1], others[2]],
        [SamplingParams(max_tokens=30, ignore_eos=True), params,
         SamplingParams(max_tokens=5, temperature=0.8, seed=1, ignore_eos=True),
         SamplingParams(max_tokens=9, temperature=1.5, top_p=0.5, ignore_eos=True)])
    assert mixed[1].token_ids == alone.token_ids
    other_seed, = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=1.0,
                                                           seed=4321, ignore_eos=True))
    assert other_seed.token_ids != alone.token_ids
