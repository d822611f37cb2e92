"""Property tests: whatever the statistics and costs, plan() returns a runnable plan."""

import math

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lightspec_jax.planner import CostTable, PlannerSpec, StepObservation, make_planner

COSTS = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def setups(draw):
    k = draw(st.integers(1, 6))
    kind = draw(st.sampled_from(["autoregressive", "parallel"]))
    buckets = tuple(sorted(draw(st.sets(st.integers(1, 64), min_size=1, max_size=12))))
    depths = (k,) if kind == "parallel" else tuple(
        sorted(draw(st.sets(st.integers(1, k), min_size=1))))
    spec = PlannerSpec(verify_buckets=buckets, draft_depths=depths, max_depth=k,
                       drafter_kind=kind)

    def table():
        empty = draw(st.integers(0, 9)) == 0  # tables are usually profiled
        keys = [] if empty else draw(st.lists(st.integers(1, 80), min_size=1, max_size=8,
                                              unique=True))
        context = draw(st.one_of(st.none(), st.integers(0, 10**6)))
        return CostTable({r: draw(COSTS) for r in keys}, context_len=context)

    policy = draw(st.sampled_from(["dynamic", "dynamic", "dynamic", "static", "dspark"]))
    options = {}
    if policy == "dynamic":
        options = dict(estimator=draw(st.sampled_from(["survival", "interpolate"])),
                       explore_fraction=draw(st.sampled_from([0.0, 0.02, 0.9])),
                       min_probe_interval=draw(st.integers(1, 5)),
                       stat_half_life=draw(st.sampled_from([None, 1.0, 512.0])))
    planner = make_planner(policy, spec, target_costs=table(), draft_costs=table(), **options)
    # mostly full batches of requests that all hold proposals, so statistics accumulate
    requests = st.tuples(st.integers(0, 9), st.integers(1, buckets[-1])).map(
        lambda t: 0 if t[0] == 0 else t[1])
    share = st.tuples(st.integers(0, 3), st.floats(0, 1)).map(
        lambda t: t[1] if t[0] == 0 else 1.0)
    steps = draw(st.lists(st.tuples(requests, share,
                                    st.integers(0, 2**31 - 1), st.booleans(), COSTS, COSTS,
                                    st.integers(0, 10**7)),
                          min_size=1, max_size=30))
    return spec, planner, steps


def check(spec, plan, n, m, d_prev):
    allowed = set(spec.draft_depths)
    assert plan.draft_depth in allowed
    assert plan.verified_depth == (d_prev if m > 0 else 0)
    if n == 0:
        assert plan.verify_rows == plan.fill_rows == 0
        return
    available = min(n + m * plan.verified_depth, spec.max_requests)
    assert n <= plan.fill_rows <= available <= n * (plan.verified_depth + 1)
    assert plan.verify_rows in spec.verify_buckets
    assert plan.verify_rows == min(b for b in spec.verify_buckets if b >= plan.fill_rows)
    assert plan.update_stats == (m == n and plan.verified_depth > 0)
    for value in (plan.predicted_ms, plan.predicted_tokens):
        assert math.isnan(value) or (math.isfinite(value) and value > 0)
    if plan.reason in ("plan", "probe"):
        assert math.isfinite(plan.predicted_ms) and math.isfinite(plan.predicted_tokens)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setups())
def test_plan_is_always_a_runnable_bucket_and_depth(setup):
    spec, planner, steps = setup
    pending = None
    d_prev = 0
    for n, share, seed, use_conf, target_ms, draft_ms, context in steps:
        rng = np.random.default_rng(seed)
        m = int(round(share * n))
        conf = rng.random((n, spec.max_depth)) if use_conf else None
        if conf is not None and n:
            conf[rng.random(conf.shape) < 0.1] = np.nan
        plan = planner.plan(num_requests=n, num_with_proposal=m, confidences=conf,
                            context_len=context)
        check(spec, plan, n, m, d_prev)
        event(plan.reason)
        if pending is not None:  # overlap: observe the previous step after this plan
            planner.observe(pending)
        accept = 1 + rng.integers(0, plan.verified_depth + 1, size=n)
        pending = StepObservation(plan=plan, accept_lens=accept, target_ms=target_ms,
                                  draft_ms=draft_ms, context_len=context)
        d_prev = plan.draft_depth
    planner.observe(pending)
