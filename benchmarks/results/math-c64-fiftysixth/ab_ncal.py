"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftysixth/ab_ncal.py POLICY_AB_ARGS)
policy_ab where dynamic variants labelled *ncal* keep the whole-step calibration
(planner/calibration.py) per band of requests decoded (N in 1, 2-3, 4-7, ..., 64+): a step's
period calibrates, and a plan is priced with, the calibration of its own N's band. Variants
labelled *wide* clip the calibration's factors to [0.5, 3] instead of [2/3, 1.5]. Variants
labelled *tcal* keep the token calibration (calibration.TokenCalibration) per band of N
the same way. Each band's calibrations are printed at exit."""
import atexit
import sys

import numpy as np
sys.path.insert(0, "benchmarks")
import ab_variants
import policy_ab
from lightspec_jax.planner.calibration import StepCalibration, TokenCalibration

orig_build = ab_variants.build
BOUNDS = [(2.0 / 3.0, 1.5)]


def band(n):
    return max(int(n), 1).bit_length()


STEP_BANDS = []  # (variant label, {band: StepCalibration})


def by_size(planner, label=""):
    cals = {}
    STEP_BANDS.append((label, cals))

    def use(n):
        cal = cals.get(band(n))
        if cal is None:
            cal = cals[band(n)] = StepCalibration(bounds=BOUNDS[0])
        if planner.calibration is not cal:
            planner.calibration = cal
            planner._scale_cache = None

    plan, period = planner._plan, planner.observe_period

    def _plan(*, n, **kw):
        use(n)
        return plan(n=n, **kw)

    def observe_period(*, plan, period_ms):
        use(plan.num_requests)
        return period(plan=plan, period_ms=period_ms)

    planner._plan, planner.observe_period = _plan, observe_period


TOKEN_BANDS = []  # (variant label, {band: TokenCalibration})


def tokens_by_size(planner, label):
    cals = {}
    TOKEN_BANDS.append((label, cals))

    def use(n):
        planner.tokens = cals.setdefault(band(n), TokenCalibration())

    plan, observe = planner._plan, planner.observe

    def _plan(*, n, **kw):
        use(n)
        return plan(n=n, **kw)

    def observe_(obs):
        use(obs.plan.num_requests)
        return observe(obs)

    planner._plan, planner.observe = _plan, observe_


def build(variant, *a, **k):
    engine = orig_build(variant, *a, **k)
    BOUNDS[0] = (0.5, 3.0) if "wide" in variant.label else (2.0 / 3.0, 1.5)
    if "wide" in variant.label:
        engine.planner.calibration = StepCalibration(bounds=BOUNDS[0])
    if "ncal" in variant.label:
        by_size(engine.planner, variant.label)
    if "tcal" in variant.label:
        tokens_by_size(engine.planner, variant.label)
    return engine


def report():
    for label, cals in STEP_BANDS:
        print(f"{label}: the step calibration by band of N - periods and the ratio "
              "(measured / modelled) of the floor, drafting and all")
        for b, cal in sorted(cals.items()):
            cells = {k: v for k, v in cal._cells.items() if not isinstance(k, tuple)}
            text = "  ".join(f"{name} {cells[k][1]} x{np.exp(cells[k][0]):.2f}"
                             for k, name in ((False, "floor"), (True, "drafting"), ("all", "all"))
                             if k in cells)
            print(f"  N {2 ** (b - 1)}-{2 ** b - 1}: {text}")
    for label, cals in TOKEN_BANDS:
        print(f"{label}: the token calibration's factors on depths 1-7, by band of N")
        for b, cal in sorted(cals.items()):
            factors = " ".join(f"{x:.2f}" for x in cal.factors(list(range(1, 8))))
            print(f"  N {2 ** (b - 1)}-{2 ** b - 1}: {factors}")


atexit.register(report)
policy_ab.build = build
policy_ab.main()
