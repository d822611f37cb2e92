"""Helpers of the dynamic planner's scenario tests (test_lightspec.py, test_explore.py): a spec,
a planner on given cost tables, a step observed, the first (cold) step."""

import numpy as np

from lightspec_jax.planner import CostTable, PlannerSpec, StepObservation, make_planner

STRIDE_1 = tuple(range(1, 17))


def spec(k=3, buckets=STRIDE_1, kind="autoregressive"):
    depths = (k,) if kind == "parallel" else tuple(range(1, k + 1))
    return PlannerSpec(verify_buckets=buckets, draft_depths=depths, max_depth=k,
                       drafter_kind=kind)


def planner(s, target=None, draft=None, **options):
    """The scenarios of §13 check its arithmetic, which has no small-sample prior on the
    survival (test_small_samples.py has it)."""
    options.setdefault("survival_prior_weight", 0.0)
    return make_planner("dynamic", s, target_costs=None if target is None else CostTable(target),
                        draft_costs=None if draft is None else CostTable(draft), **options)


def observe(p, plan, accept, **kw):
    p.observe(StepObservation(plan=plan, accept_lens=np.array(accept), **kw))


def warm(p, n=2):
    """One step so that a depth-K proposal exists (the first step has none)."""
    first = p.plan(num_requests=n)
    assert first.verified_depth == 0 and first.fill_rows == n
    return first
