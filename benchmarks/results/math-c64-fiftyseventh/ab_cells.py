"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftyseventh/ab_cells.py POLICY_AB_ARGS)
policy_ab; after the run, each dynamic variant's whole-step calibration (planner/
calibration.py): its regimes (the floor, drafting, all) and every (bucket, depth) cell, as
periods seen and the measured / modelled ratio."""
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
import policy_ab  # noqa: E402

PLANNERS = []


def keep(variant, engine):
    if engine.planner is not None and hasattr(engine.planner, "calibration"):
        PLANNERS.append((variant.label, engine.planner))


policy_ab.main_with(keep)
for label, planner in PLANNERS:
    cal = planner.calibration
    print(f"{label}: steps {planner.steps}")
    for key in (False, True, "all"):
        cell = cal._cells.get(key)
        if cell:
            print(f"  regime {key}: n {cell[1]} x{np.exp(cell[0]):.3f}")
    cells = sorted(k for k in cal._cells if isinstance(k, tuple))
    for d in sorted({k[1] for k in cells}):
        row = "  ".join(f"B{b}:{cal._cells[(b, d)][1]}x{np.exp(cal._cells[(b, d)][0]):.2f}"
                        for b, dd in cells if dd == d)
        print(f"  depth {d}: {row}")
