"""Probabilistic verification's rule and its proposal draws, on fixed p and q (no engine):
rejection sampling (rejection_outcome) emits p and accepts a draft with probability
1 - TV(p, q), a point-mass draft x with p(x); draw_proposal's token is a draw from the q it
returns, and a coupled draw uses the target's own noise.

The distribution tests have power: the same statistic rejects a deliberately wrong rule (one
that redraws a rejected token from p instead of from norm(max(0, p - q))). The engine-level
tests are in test_probabilistic.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

from lightspec_jax.engine.verifier import rejection_outcome
from lightspec_jax.sampling import ProposalSampling, draw, draw_proposal

from conftest import SIGNIFICANCE


def _fixed_case(rows=40_000, vocab=12, support=6, seed=0):
    """p over `vocab` tokens, q over a `support`-token subset, drafts drawn from q."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.7))
    ids = rng.choice(vocab, support, replace=False)
    q_probs = rng.dirichlet(np.full(support, 1.0))
    keys = jax.random.split(jax.random.key(seed), 3 * rows).reshape(3, rows)
    pick = jax.vmap(lambda k: jax.random.categorical(k, jnp.log(jnp.asarray(q_probs))))(keys[0])
    x = jnp.asarray(ids)[pick].astype(jnp.int32)
    tile = lambda a, dtype: jnp.broadcast_to(jnp.asarray(a, dtype), (rows,) + a.shape)  # noqa: E731
    return p, ids, q_probs, tile(p, jnp.float32), x, tile(ids, jnp.int32), \
        tile(q_probs, jnp.float32), keys


def test_rejection_rule_emits_p_and_accepts_one_minus_tv():
    p, ids, q_probs, p_rows, x, q_ids, q_rows, keys = _fixed_case()
    out = rejection_outcome(p_rows, x, q_ids, q_rows, keys[1], keys[2], fallback=x)
    counts = np.bincount(np.asarray(out), minlength=len(p))
    assert chisquare(counts, len(out) * p).pvalue > SIGNIFICANCE
    q = np.zeros_like(p)
    q[ids] = q_probs
    accept_rate = float(np.mean(np.asarray(out) == np.asarray(x)))
    expected = np.minimum(p, q).sum()  # 1 - TV(p, q)
    assert abs(accept_rate - expected) < 4 * np.sqrt(expected * (1 - expected) / len(out))


def test_rejection_rule_test_has_power():
    """Redrawing a rejected token from p (not the residual) is caught by the same test."""
    p, ids, q_probs, p_rows, x, q_ids, q_rows, keys = _fixed_case()
    out = rejection_outcome(p_rows, x, q_ids, q_rows, keys[1], keys[2], fallback=x)
    from_p = jax.vmap(jax.random.categorical)(keys[2], jnp.log(p_rows))
    wrong = jnp.where(out == x, x, from_p)  # accepted drafts kept, rejections redrawn from p
    counts = np.bincount(np.asarray(wrong), minlength=len(p))
    assert chisquare(counts, len(wrong) * p).pvalue < SIGNIFICANCE


def test_point_mass_proposals_reduce_to_p_of_the_draft():
    """A deterministic draft (q one-hot, M = 1) is accepted with probability p(x)."""
    p, _, _, p_rows, _, _, _, keys = _fixed_case()
    x = jnp.full(p_rows.shape[:1], int(np.argmax(p)), jnp.int32)
    out = rejection_outcome(p_rows, x, x[:, None], jnp.ones((len(x), 1)), keys[1], keys[2],
                            fallback=x)
    counts = np.bincount(np.asarray(out), minlength=len(p))
    assert chisquare(counts, len(out) * p).pvalue > SIGNIFICANCE


def test_draws_come_from_the_returned_q():
    """draw_proposal's token is a draw from the q it returns (top-k / top-p applied), its
    confidence is max q, and greedy rows get the argmax as a point mass."""
    rows, vocab = 20_000, 40
    logits = jax.random.normal(jax.random.key(1), (vocab,)) * 2.0
    logits = jnp.broadcast_to(logits, (rows, vocab))
    full = lambda value, dtype: jnp.full((rows,), value, dtype)  # noqa: E731
    for top_k, top_p in ((0, 1.0), (5, 1.0), (0, 0.8)):
        sampling = ProposalSampling(full(0.8, jnp.float32), full(top_k, jnp.int32),
                                    full(top_p, jnp.float32), jnp.arange(rows, dtype=jnp.uint32),
                                    full(3, jnp.int32), support=16, vocab=vocab)
        d = draw_proposal(logits, full(9, jnp.int32), sampling)
        q = np.zeros(vocab)
        used = np.asarray(d.q_ids[0]) >= 0
        q[np.asarray(d.q_ids[0])[used]] = np.asarray(d.q_probs[0])[used]
        assert q.sum() == pytest.approx(1.0, abs=1e-5)
        assert used.sum() <= (top_k or 16)
        assert float(d.conf[0]) == pytest.approx(q.max())
        counts = np.bincount(np.asarray(d.token), minlength=vocab)
        assert counts[q == 0].sum() == 0
        expected = rows * q[q > 0] / q[q > 0].sum()  # float64: chisquare checks the sums
        assert chisquare(counts[q > 0], expected).pvalue > SIGNIFICANCE
    greedy = draw_proposal(logits, full(9, jnp.int32), sampling._replace(
        temperature=full(0.0, jnp.float32)))
    assert np.all(np.asarray(greedy.token) == int(jnp.argmax(logits[0])))
    assert np.all(np.asarray(greedy.q_probs[:, 0]) == 1.0)


def test_coupled_draws_use_the_targets_noise():
    """A coupled draft from q = p (the whole vocabulary kept) is the target's own seeded
    sample, row for row; from a different q it still hits it far more often than chance."""
    rows, vocab = 4000, 40
    logits = jax.random.normal(jax.random.key(2), (rows, vocab)) * 2.0
    temperature = jnp.full((rows,), 0.9)
    seed, position = jnp.arange(rows, dtype=jnp.uint32), jnp.full((rows,), 11, jnp.int32)
    target = draw(logits, logits / 0.9, temperature, seed, position)
    sampling = ProposalSampling(temperature, jnp.zeros((rows,), jnp.int32), jnp.ones((rows,)),
                                seed, jnp.zeros((rows,), jnp.int32), support=vocab,
                                vocab=vocab, coupled=True)
    same = draw_proposal(logits, position, sampling)
    assert np.array_equal(np.asarray(same.token), np.asarray(target))
    other = logits + jax.random.normal(jax.random.key(3), logits.shape)  # a different q
    hits = np.mean(np.asarray(draw_proposal(other, position, sampling).token)
                   == np.asarray(target))
    independent = np.mean(np.asarray(draw_proposal(other, position, sampling._replace(
        coupled=False)).token) == np.asarray(target))
    assert hits > independent + 0.2
