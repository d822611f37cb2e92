"""Workload profiles reproduce the public acceptance figures they are calibrated to."""

import numpy as np
import pytest

from lightspec_jax.planner.synthetic import PROFILES, AcceptanceModel
from lightspec_jax.planner.sim.simulate import SimConfig, run


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_acceptance_length_at_depth_7_matches_dspark_table_1(name):
    model = AcceptanceModel.calibrated(name)
    assert model.acceptance_length(7) == pytest.approx(PROFILES[name].tau7, abs=1e-3)
    taus = [model.acceptance_length(k) for k in range(1, 12)]
    assert all(b > a for a, b in zip(taus, taus[1:]))  # deeper drafts never commit less


def test_chat_conditional_acceptance_rises_along_the_block_as_reported():
    # DSpark: Eagle3 conditional acceptance rises from 0.53 to 0.74 along a chat block
    cond = AcceptanceModel.calibrated("chat").conditional(7)
    assert cond[6] - cond[0] == pytest.approx(0.74 - 0.53, abs=2e-3)
    assert np.all(np.diff(cond) > 0)


def test_workloads_order_as_published():
    taus = {name: AcceptanceModel.calibrated(name).acceptance_length(7) for name in PROFILES}
    assert taus["chat"] < taus["code"] < taus["math"]


def test_confidences_are_informative_but_miscalibrated():
    model = AcceptanceModel.calibrated("chat")
    rng = np.random.default_rng(0)
    n = 50_000
    quality = rng.normal(model.mu, model.profile.request_sigma, n)
    _, accepted, conf = model.step(rng, quality, model.initial_drift(rng, n), 1)
    hit = accepted >= 1
    assert conf[hit, 0].mean() > conf[~hit, 0].mean() + 0.1  # informative
    assert abs(conf[:, 0].mean() - hit.mean()) > 0.05  # but not calibrated


def test_prepared_draws_answer_as_the_model_states_it():
    # The module's rule, written out: position j accepted when u < sigmoid(l), l = m + z +
    # beta_j + sigma_tok * eps; the count is the leading accepted positions; c = sigmoid(gain *
    # (l + noise * eta) + bias). A block prepared at once (the engine's SyntheticAcceptance)
    # answers each of its steps as that rule does, u = 0 and all-accepted rows included.
    from lightspec_jax.planner.synthetic import depth_offsets

    model, p = AcceptanceModel.calibrated("code"), PROFILES["code"]
    rng = np.random.default_rng(0)
    steps, n, k = 3, 4000, 7
    draws = (rng.standard_normal((steps, n)), rng.standard_normal((steps, n, k)),
             rng.random((steps, n, k)), rng.standard_normal((steps, n, k)))
    draws[2][0, :5] = 0.0
    quality = rng.normal(model.mu, p.request_sigma, n)
    drift = model.initial_drift(rng, n)
    prepared = model.prepare(*draws)
    for t in range(steps):
        dn, tn, u, cn = (d[t] for d in draws)
        want_drift = p.drift_rho * drift + np.sqrt(1 - p.drift_rho ** 2) * p.drift_sigma * dn
        logits = ((quality + want_drift)[:, None] + depth_offsets(model.slope, k)
                  + p.token_sigma * tn)
        accepted = u < 1.0 / (1.0 + np.exp(-logits))
        want_a = np.cumprod(accepted, axis=1).sum(axis=1)
        want_c = 1.0 / (1.0 + np.exp(-(p.conf_gain * (logits + p.conf_noise * cn)
                                       + p.conf_bias)))
        got_drift, got_a, got_c = model.respond_drawn(quality, drift, prepared[t])
        np.testing.assert_array_equal(got_a, want_a)
        np.testing.assert_allclose(got_c, want_c, rtol=1e-12)
        np.testing.assert_allclose(got_drift, want_drift, rtol=1e-12)
        one = model.respond(quality, drift, dn, tn, u, cn)  # one step, prepared on the fly
        np.testing.assert_array_equal(one[1], want_a)
        assert (want_a == k).any() and (want_a == 0).any()
        drift = got_drift


def test_simulated_static_depth_7_reproduces_the_calibration_target():
    # End to end: the sampler, request lengths and step loop give the figure the quadrature
    # was solved for (steps weigh slow requests more, as a measured acceptance length does).
    result = run(SimConfig(profile="chat", concurrency=64, policy="static-7",
                           num_requests=768, seed=3))
    assert result.acceptance_length == pytest.approx(PROFILES["chat"].tau7, abs=0.1)


def test_survival_is_what_the_draws_accept():
    # AcceptanceModel.survival, the informed oracle's knowledge: for requests in a given
    # state, P(drafts 1..j all accepted) equals the share of drawn steps that accept them.
    model = AcceptanceModel.calibrated("math")
    rng = np.random.default_rng(0)
    n, k = 40_000, 6
    quality = np.repeat([model.mu - 1.0, model.mu + 1.0], n // 2)
    drift = np.zeros(n)
    zero = np.zeros(n)  # no innovation: the draws are taken at this very state
    _, accepted, _ = model.respond(quality, drift, zero, rng.standard_normal((n, k)),
                                   rng.random((n, k)), rng.standard_normal((n, k)))
    survival = model.survival(quality + drift, k)  # [N, K]
    for half in (slice(0, n // 2), slice(n // 2, n)):
        drawn = [(accepted[half] >= j).mean() for j in range(1, k + 1)]
        assert np.allclose(drawn, survival[half][0], atol=0.01)
    assert (np.diff(survival, axis=1) <= 0).all() and (survival[:n // 2] < survival[n // 2:]).all()


def test_survival_over_a_spread_state_is_what_its_draws_accept():
    # Known only up to a normal spread (an informed oracle that knows the quality, not the
    # drift), the state's survival is the draws' average over that spread.
    model = AcceptanceModel.calibrated("code")
    rng = np.random.default_rng(1)
    n, k, spread = 60_000, 5, model.profile.drift_sigma
    quality = np.full(n, model.mu)
    drift = rng.normal(0.0, spread, n)
    _, accepted, _ = model.respond(quality, drift, np.zeros(n), rng.standard_normal((n, k)),
                                   rng.random((n, k)), rng.standard_normal((n, k)))
    expected = model.survival(quality[:1], k, spread)[0]
    assert np.allclose([(accepted >= j).mean() for j in range(1, k + 1)], expected, atol=0.01)
    # a spread state accepts deep drafts more often than its mean state would (convexity)
    assert expected[-1] > model.survival(quality[:1], k)[0, -1]
