"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftysixth/ab_ncal.py POLICY_AB_ARGS)
policy_ab where dynamic variants labelled *ncal* keep the whole-step calibration
(planner/calibration.py) per band of requests decoded (N in 1, 2-3, 4-7, ..., 64+): a step's
period calibrates, and a plan is priced with, the calibration of its own N's band. Variants
labelled *wide* clip the calibration's factors to [0.5, 3] instead of [2/3, 1.5]. Variants
labelled *tcal* keep the token calibration (calibration.TokenCalibration) per band of N
the same way. Each band's calibrations are printed after the run."""
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
import policy_ab  # noqa: E402
from lightspec_jax.planner.calibration import StepCalibration, TokenCalibration  # noqa: E402

STEP_BANDS = []  # (variant label, {band: StepCalibration})
TOKEN_BANDS = []  # (variant label, {band: TokenCalibration})


def band(n):
    return max(int(n), 1).bit_length()


def per_band(planner, attr, make, observer, plan_of):
    """Keeps planner.<attr> (a calibration) per band of N: the band's own is swapped in
    before each plan() and before each call of planner.<observer>, by the N of the plan that
    call carries (plan_of). Returns {band: calibration}."""
    cals = {}

    def use(n):
        cal = cals.get(band(n))
        if cal is None:
            cal = cals[band(n)] = make()
        if getattr(planner, attr) is not cal:
            setattr(planner, attr, cal)
            planner._scale_cache = None  # priced with the calibration swapped out

    plan, observe = planner._plan, getattr(planner, observer)

    def _plan(*, n, **kw):
        use(n)
        return plan(n=n, **kw)

    def observed(*args, **kwargs):
        use(plan_of(*args, **kwargs).num_requests)
        return observe(*args, **kwargs)

    planner._plan = _plan
    setattr(planner, observer, observed)
    return cals


def calibrate(variant, engine):
    label, planner = variant.label, engine.planner
    bounds = (0.5, 3.0) if "wide" in label else (2.0 / 3.0, 1.5)
    if "wide" in label:
        planner.calibration = StepCalibration(bounds=bounds)
    if "ncal" in label:
        STEP_BANDS.append((label, per_band(planner, "calibration",
                                           lambda: StepCalibration(bounds=bounds),
                                           "observe_period", lambda *, plan, **_: plan)))
    if "tcal" in label:
        TOKEN_BANDS.append((label, per_band(planner, "tokens", TokenCalibration, "observe",
                                            lambda obs: obs.plan)))


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


policy_ab.main_with(calibrate)
report()
