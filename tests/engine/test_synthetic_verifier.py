"""The benchmarks' synthetic verifier (engine/verifier.py, SyntheticAcceptance): a step that
verifies no draft (the floor) draws no outcome, yet the acceptance it models runs on as if it
had - the drift moves every step, and verifying steps answer as the profile's model states."""

import numpy as np

from lightspec_jax.engine.verifier import SyntheticAcceptance

N, K = 48, 7


def verifier(seed=3):
    v = SyntheticAcceptance("code", num_slots=N, max_depth=K, seed=seed)
    v.admit(np.arange(N))
    return v


def test_floor_steps_draw_nothing_and_change_nothing_else():
    rng = np.random.default_rng(0)
    every, mixed = verifier(), verifier()
    active = rng.random(N) < 0.8
    verifies = rng.random(100) < 0.3  # crosses several blocks of steps of either kind
    for step, verifying in enumerate(verifies):
        want = every.host_inputs(active)
        before = mixed.drift.copy()
        got = mixed.host_inputs(active, verifies=bool(verifying))
        # The drift's path does not depend on which steps verified.
        np.testing.assert_array_equal(mixed.drift, every.drift, err_msg=f"step {step}")
        if not verifying:
            assert not got[0].any() and not got[1].any()
            assert got[0].shape == want[0].shape and got[1].shape == want[1].shape
            continue
        # A verifying step answers from its drift as the model states (synthetic.py).
        draws = mixed._draws[mixed._draws_at - 1]
        accepted = (((mixed.quality + mixed.drift)[:, None] > draws.threshold)
                    .argmin(axis=1))
        np.testing.assert_array_equal(got[0], np.where(active, accepted, 0))
        assert not np.array_equal(mixed.drift, before)
    assert verifies.sum() > 20 and (~verifies).sum() > 40


def test_verifying_steps_accept_as_often_either_way():
    """Skipping the floor's draws keeps the outcome statistics: over many steps, the mean
    accepted count of verifying steps matches an every-step run's (the same requests; the
    draws do not depend on which steps verify)."""
    active = np.ones(N, bool)
    every, mixed = verifier(seed=11), verifier(seed=11)
    a = np.concatenate([every.host_inputs(active)[0] for _ in range(400)])
    b = []
    for i in range(1200):
        got = mixed.host_inputs(active, verifies=i % 3 == 0)[0]
        if i % 3 == 0:
            b.append(got)
    b = np.concatenate(b)
    assert len(a) == len(b) and 1.0 < a.mean() < K - 1.0
    assert abs(a.mean() - b.mean()) < 0.05 * a.mean(), (a.mean(), b.mean())
