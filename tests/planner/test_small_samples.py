"""What the planner learns from few requests: a lone request's unlucky first steps, trimmed
steps, noisy per-depth costs, and predictions that run ahead of what deep proposals accept."""

import math

import numpy as np
import pytest

from lightspec_jax.planner import AcceptanceStats, CostTable, PlannerSpec, make_planner
from lightspec_jax.planner.calibration import TokenCalibration
from lightspec_jax.planner.objective import StepCosts
from test_host_costs import _outcome  # the step as the device runs it

OFF = dict(calibrate_tokens=False, linear_depth=False, survival_from_trimmed=False,
           survival_prior_weight=0.0)


def _record(stats, n, u, d, accept, verify_lens=None):
    stats.record(num_requests=n, fill_rows=u, depth=d, accept_lens=np.array(accept),
                 verify_lens=None if verify_lens is None else np.array(verify_lens), step=0)


def test_a_first_unlucky_sample_meets_the_prior_instead_of_zeroing_the_deep_depths():
    """One request, two full-width steps that accepted 1 and 0 of 3 drafts: alone they say
    every draft past the first is never accepted; with the prior (a quarter of a full-weight
    step against their two sixteenths) the deep depths stay well above 0."""
    bare = AcceptanceStats(max_depth=3, sample_floor=16)
    prior = AcceptanceStats(max_depth=3, sample_floor=16, prior_weight=0.25, prior_accept=0.9)
    for stats in (bare, prior):
        _record(stats, 1, 4, 3, [2])
        _record(stats, 1, 4, 3, [1])
    assert bare.survival[1:].tolist() == [0.5, 0.0, 0.0]
    want = (0.25 * 0.9 ** np.arange(1, 4) + 0.125 * np.array([0.5, 0.0, 0.0])) / 0.375
    assert prior.survival[1:] == pytest.approx(want)
    # A batch that measures a lot outweighs the prior at once: 64 requests are 4 full steps.
    big = AcceptanceStats(max_depth=3, sample_floor=16, prior_weight=0.25, prior_accept=0.9)
    _record(big, 64, 256, 3, [1] * 64)
    assert big.survival[1:].max() < 0.9 * 0.25 / 1.25 + 1e-12


def test_trimmed_steps_teach_the_depths_every_request_had_verified():
    """A trimmed step with verify lengths [3, 2] (2 and 1 drafts) saw depth 1 for both
    requests: that depth learns, deeper ones (seen for one request only) do not."""
    on = AcceptanceStats(max_depth=3, survival_from_trimmed=True)
    off = AcceptanceStats(max_depth=3)
    for stats in (on, off):
        _record(stats, 2, 5, 3, [3, 1], verify_lens=[3, 2])
    assert on.survival[1] == 0.5 and np.isnan(on.survival[2:]).all()
    assert np.isnan(off.survival[1:]).all()
    # Without verify lengths nothing says which depths every request saw.
    blind = AcceptanceStats(max_depth=3, survival_from_trimmed=True)
    _record(blind, 2, 5, 3, [3, 1])
    assert not blind.has_survival


def test_a_lone_request_with_an_unlucky_start_gets_back_to_full_width():
    """c = 1, probes off: the first two verifies accept 1 and 0 of 3 drafts, then every
    draft is accepted 95% of the time. Without the prior the deep rows are priced at 0,
    trimmed away, never measured again: the planner verifies 2 rows for good. With it
    (and trimmed steps teaching depth 1) it returns to the full 4 rows."""
    s = PlannerSpec(verify_buckets=(1, 2, 3, 4), draft_depths=(3,), max_depth=3)
    costs = dict(target_costs=CostTable({1: 3.0, 2: 3.3, 3: 3.6, 4: 3.9}),
                 draft_costs=CostTable({b: 0.2 for b in (1, 2, 3, 4)}),
                 depth_costs=CostTable({1: 0.3, 2: 0.6, 3: 0.9}))

    def serve(**options):
        p = make_planner("dynamic", s, **costs, explore_fraction=0.0, replan_every=1,
                         **options)
        rng = np.random.default_rng(0)
        p.plan(num_requests=1)
        fills = []
        for i, first in enumerate([[2], [1]] + [None] * 60):
            plan = p.plan(num_requests=1)
            if first is not None:
                obs = _outcome(plan, rng, 0.95)
                obs = type(obs)(plan=plan, accept_lens=np.array(first),
                                verify_lens=obs.verify_lens)
            else:
                obs = _outcome(plan, rng, 0.95)
            p.observe(obs)
            fills.append(plan.fill_rows)
        return fills

    assert serve(**OFF)[-20:] == [2] * 20
    assert serve()[-20:].count(4) >= 18


def test_token_calibration_is_a_line_through_accepted_over_predicted_drafts():
    cal = TokenCalibration(decay=0.98, prior_drafts=8.0)
    assert cal.factors([0, 3, 7]).tolist() == [1.0, 1.0, 1.0]  # nothing measured
    for _ in range(200):
        cal.observe(depth=7, predicted_drafts=10.0, accepted_drafts=8.0)
        cal.observe(depth=2, predicted_drafts=4.0, accepted_drafts=4.0)
    f = cal.factors([0, 2, 7, 9])
    # through (2, 1.0) and (7, 0.8), continued to depth 9; the floor has no drafts
    assert f[0] == 1.0 and f[1] == pytest.approx(1.0, abs=0.01)
    assert f[2] == pytest.approx(0.8, abs=0.01) and f[3] == pytest.approx(0.72, abs=0.01)
    # A depth rarely visited is priced from its neighbours more than from its own steps.
    cal.observe(depth=5, predicted_drafts=10.0, accepted_drafts=2.0)
    assert cal.factors([5])[0] > 0.8
    # A lone request's few drafts move it little: one step that accepted nothing of 3.
    one = TokenCalibration(prior_drafts=8.0)
    one.observe(depth=3, predicted_drafts=3.0, accepted_drafts=0.0)
    assert one.factors([1, 3, 7]) == pytest.approx([8.0 / 11.0] * 3)  # one depth: flat
    # Bounded, and bad samples are ignored.
    low = TokenCalibration(prior_drafts=1.0, bounds=(0.5, 1.5))
    for _ in range(50):
        low.observe(depth=1, predicted_drafts=10.0, accepted_drafts=0.0)
    for bad in (math.nan, -1.0, math.inf):
        low.observe(depth=2, predicted_drafts=bad, accepted_drafts=1.0)
        low.observe(depth=2, predicted_drafts=1.0, accepted_drafts=bad)
    low.observe(depth=0, predicted_drafts=1.0, accepted_drafts=5.0)
    assert low.factors([0, 1, 2]).tolist() == [1.0, 0.5, 0.5]


def test_deep_proposals_that_accept_less_than_predicted_give_way_to_shallower_ones():
    """The planner chooses depth from its model; if the steps verifying its proposals accept
    fewer drafts than it predicted, the more so the deeper (as on the tiny pair at c = 1), it
    drafts shallower (and does not with calibrate_tokens off)."""
    s = PlannerSpec(verify_buckets=tuple(range(1, 9)), draft_depths=(1, 2, 3, 4, 5, 6, 7),
                    max_depth=7)
    costs = dict(target_costs=CostTable({b: 3.0 + 0.3 * b for b in range(1, 9)}),
                 draft_costs=CostTable({b: 0.1 for b in range(1, 9)}),
                 depth_costs=CostTable({d: 0.3 * d for d in range(1, 8)}))

    def depth_after(shortfall: float, **options):
        p = make_planner("dynamic", s, **costs, explore_fraction=0.0, replan_every=1,
                         **options)
        rng = np.random.default_rng(1)
        p.plan(num_requests=1)
        for _ in range(120):
            plan = p.plan(num_requests=1)
            p.observe(_outcome(plan, rng, 0.9))
            d = plan.verified_depth
            if d >= 1:  # what the device would have told on top: short by shortfall per depth
                p.tokens.observe(depth=d, predicted_drafts=plan.predicted_tokens - 1,
                                 accepted_drafts=(1.0 - shortfall * (d - 1))
                                 * (plan.predicted_tokens - 1))
        return p.plan(num_requests=1).draft_depth

    deep = depth_after(0.0)
    assert deep >= 4
    assert depth_after(0.08) < deep
    assert depth_after(0.08, calibrate_tokens=False) == depth_after(0.0, calibrate_tokens=False)


def test_an_autoregressive_stage_is_priced_on_its_line():
    """A stage measured at 0.3 ms per depth, but depths 5 and 6 timed alike once: depth by
    depth 6 costs what 5 does; on the line each depth is 0.3 ms above the one before, and a
    well-measured depth pulls the line more than a noisy one."""
    s = PlannerSpec(verify_buckets=(1, 2, 4, 8), draft_depths=tuple(range(1, 8)), max_depth=7)
    noisy = CostTable({1: 0.3, 2: 0.6, 3: 0.9, 4: 1.2, 5: 1.6, 6: 1.6, 7: 2.1})
    target, draft = CostTable({b: 1.0 for b in (1, 2, 4, 8)}), CostTable({1: 0.1})

    def stage(table, **kw):
        c = StepCosts.price(s, target, draft, num_requests=1, context_len=None,
                            depth_costs=table, **kw)
        return np.array([c.depth_ms(d) for d in range(8)])

    cells = stage(noisy)
    assert cells[6] == cells[5]
    line = stage(noisy, linear_depth=True)
    assert line[0] == 0.0 and np.allclose(np.diff(line[1:]), np.diff(line[1:])[0])
    assert np.diff(line[1:])[0] == pytest.approx(0.3, abs=0.02)
    exact = CostTable({d: 0.2 + 0.25 * d for d in range(1, 8)})
    assert stage(exact, linear_depth=True)[1:] == pytest.approx(0.2 + 0.25 * np.arange(1, 8))
    # A depth measured 50 times outweighs six measured once.
    weighted = CostTable({d: 0.3 * d for d in range(1, 8)})
    for _ in range(50):
        weighted.update(3, 1.5)
    assert abs(stage(weighted, linear_depth=True)[3] - weighted.estimate(3)) < 0.15
    # A parallel drafter's block is no chain of forwards: priced cell by cell.
    block = PlannerSpec(verify_buckets=(1, 2, 4, 8), draft_depths=tuple(range(1, 8)),
                        max_depth=7, drafter_kind="parallel", block_size=8, block_lead=1)
    c = StepCosts.price(block, target, draft, num_requests=1, context_len=None,
                        depth_costs=noisy, linear_depth=True)
    assert c.depth_ms(6) == c.depth_ms(5)


def test_trimmed_steps_of_short_proposals_teach_every_depth_they_saw():
    """A lookup drafter's trimmed step (`uncensored` given), depth 3, three requests: the
    fill cut one proposal after 2 drafts; one proposed 1 draft and one nothing, each verified
    whole. The short ones were seen at every depth (their missing drafts are misses), so the
    survival learns depths 1 and 2, all the cut request had verified. (Such steps taught it
    nothing before, and at c = 1 a lookup drafter trimmed one step in two.)"""
    stats = AcceptanceStats(max_depth=3, survival_from_trimmed=True)
    stats.record(num_requests=3, fill_rows=6, depth=3, accept_lens=np.array([3, 2, 1]),
                 verify_lens=np.array([3, 2, 1]), step=0,
                 uncensored=np.array([False, True, True]))
    np.testing.assert_allclose(stats.survival[1:3], [2 / 3, 1 / 3])
    assert np.isnan(stats.survival[3])
    # Every proposal verified whole: the trimmed step saw the whole depth.
    whole = AcceptanceStats(max_depth=3, survival_from_trimmed=True)
    whole.record(num_requests=2, fill_rows=4, depth=3, accept_lens=np.array([3, 1]),
                 verify_lens=np.array([3, 1]), step=0, uncensored=np.array([True, True]))
    np.testing.assert_allclose(whole.survival[1:], [0.5, 0.5, 0.0])
