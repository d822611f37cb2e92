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
    floor = kind == "autoregressive" and draw(st.booleans())
    spec = PlannerSpec(verify_buckets=buckets, draft_depths=depths, max_depth=k,
                       drafter_kind=kind, floor=floor)

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
    host = CostTable({r: draw(COSTS) for r in draw(st.lists(st.integers(1, 80), max_size=3,
                                                            unique=True))})
    planner = make_planner(policy, spec, target_costs=table(), draft_costs=table(),
                           host_costs=host, overlap=draw(st.booleans()), **options)
    # mostly full batches of requests that all hold proposals, so statistics accumulate
    requests = st.tuples(st.integers(0, 9), st.integers(1, buckets[-1])).map(
        lambda t: 0 if t[0] == 0 else t[1])
    share = st.tuples(st.integers(0, 3), st.floats(0, 1)).map(
        lambda t: t[1] if t[0] == 0 else 1.0)
    steps = draw(st.lists(st.tuples(requests, share,
                                    st.integers(0, 2**31 - 1), st.booleans(), COSTS, COSTS,
                                    st.integers(0, 10**7), st.booleans()),
                          min_size=1, max_size=30))
    return spec, planner, steps


def check(spec, plan, n, m, d_prev, remaining=None):
    allowed = set(spec.choices)
    assert plan.draft_depth in allowed
    assert plan.verified_depth == (d_prev if m > 0 else 0)
    if n == 0:
        assert plan.verify_rows == plan.fill_rows == 0
        return
    available = min(n + m * plan.verified_depth, spec.max_requests)
    if remaining is not None:  # never a row past a request's allowance
        d = plan.verified_depth
        assert plan.full_rows == n + min(m * d, int(np.minimum(remaining - 1, d).sum()))
        available = min(available, plan.full_rows)
    assert n <= plan.fill_rows <= available <= n * (plan.verified_depth + 1)
    assert plan.verify_rows in spec.verify_buckets
    assert plan.verify_rows == min(b for b in spec.verify_buckets if b >= plan.fill_rows)
    assert plan.update_stats == (m > 0 and plan.verified_depth > 0)
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
    for n, share, seed, use_conf, target_ms, draft_ms, context, ends in steps:
        rng = np.random.default_rng(seed)
        m = int(round(share * n))
        conf = rng.random((n, spec.max_depth)) if use_conf else None
        if conf is not None and n:
            conf[rng.random(conf.shape) < 0.1] = np.nan
        remaining = rng.integers(1, 2 * spec.max_depth + 2, size=n) if ends else None
        plan = planner.plan(num_requests=n, num_with_proposal=m, confidences=conf,
                            context_len=context, remaining=remaining)
        check(spec, plan, n, m, d_prev, remaining)
        event(plan.reason)
        if pending is not None:  # overlap: observe the previous step after this plan
            planner.observe(pending)
        accept = 1 + rng.integers(0, plan.verified_depth + 1, size=n)
        pending = StepObservation(plan=plan, accept_lens=accept, target_ms=target_ms,
                                  draft_ms=draft_ms, context_len=context)
        d_prev = plan.draft_depth
    planner.observe(pending)


ACCEPTANCE = st.sampled_from(["all", "none", "random"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 7), n=st.integers(1, 24), acceptance=ACCEPTANCE,
       shape=st.sampled_from(["flat", "linear", "steep", "random"]),
       host=st.sampled_from([None, "small", "dominant"]), seed=st.integers(0, 2**31 - 1))
def test_never_prices_a_choice_above_the_floor(k, n, acceptance, shape, host, seed):
    """The next depth's best configuration costs at most what the floor (draft nothing, verify
    one row per request) costs per token, as the planner itself prices both - give or take the
    floor margin, the share by which the floor must win to be taken: whatever the statistics
    (all accepted, none, random) and costs (flat, steep, host-dominated)."""
    rng = np.random.default_rng(seed)
    buckets = tuple(range(1, 4 * 8 * 8 + 1, 3))
    spec = PlannerSpec(verify_buckets=buckets, draft_depths=tuple(range(1, k + 1)),
                       max_depth=k, floor=True)
    price = {"flat": lambda b: 5.0, "linear": lambda b: 1.0 + 0.1 * b,
             "steep": lambda b: 0.1 + 3.0 * b, "random": lambda b: float(rng.uniform(0.1, 50))}
    target = CostTable({b: price[shape](b) for b in buckets})
    draft = CostTable({b: 0.01 + 0.05 * price[shape](b) for b in buckets})
    home = target.estimate(spec.bucket_for(n))
    stage = CostTable({d: 0.1 * d * home for d in range(1, k + 1)})  # 10% a drafted token
    hosts = None if host is None else CostTable(
        {n: 0.01 if host == "small" else 1e4})
    planner = make_planner("dynamic", spec, target_costs=target, draft_costs=draft,
                           depth_costs=stage, host_costs=hosts, explore_fraction=0.0,
                           reprice_every=1)
    plan = planner.plan(num_requests=n)
    for _ in range(12):
        plan = planner.plan(num_requests=n)
        d = plan.verified_depth
        accept = {"all": np.full(n, d + 1), "none": np.ones(n, int),
                  "random": 1 + rng.integers(0, d + 1, size=n)}[acceptance]
        planner.observe(StepObservation(plan=plan, accept_lens=accept))
    plan = planner.plan(num_requests=n)
    floor = planner.ms_per_token(num_requests=n, fill_rows=n, depth=0)
    d = plan.draft_depth
    full = min(n * (d + 1), spec.max_requests)
    rows = sorted({min(b, full) for b in buckets if b >= n and b <= spec.bucket_for(full)})
    best = min(planner.ms_per_token(num_requests=n, fill_rows=u, depth=d) for u in rows)
    event(f"depth {'0 (floor)' if d == 0 else '>0'}")
    margin = planner.options.floor_margin
    assert best <= floor / (1 - margin) * (1 + 1e-9)
    if acceptance == "none" and host != "dominant" and shape != "random":
        assert d == 0  # nothing is ever accepted: with costs rising in rows, drafting only costs
