"""A cost table's unmeasured cells, imputed from its other context columns (costs.CostTable).

A table measures the buckets the planner runs, at the contexts it runs them; the others are
read from the nearest column (in log context) that holds the row and shares measured rows
with the column asked for, moved by how the two columns differ on those shared rows:

* "shift" adds the median difference (a forward whose context cost does not depend on its
  key: the rows of one verify read each request's KV once, so attention adds a roughly
  row-independent cost per context, and the shift learned on the buckets in use carries over
  to the others);
* "scale" multiplies by the median ratio (a cost that grows with its key, as a draft stage
  keyed by depth re-reads the context once per depth).

With no such column, the nearest holder's value as is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

# A table's cells: column (snapped context, or None for a context-free table) -> rows ->
# [ms, samples].
Cells = Mapping[int | None, Mapping[int, list]]


def donor_order(cells: Cells, column: int | None) -> list:
    """Every column of `cells` but `column`, nearest in log context first; ties keep the
    insertion order."""
    return sorted((c for c in cells if c != column), key=lambda c: _log_distance(c, column))


def impute_column(cells: Cells, column: int | None, row_keys: Sequence[int],
                  donors: Sequence, mode: str) -> list[float]:
    """`column` over every row key [len(row_keys)], its measured cells as they are and the
    others imputed from `donors` (donor_order) by `mode` ("shift" or "scale"); NaN where no
    column holds the row."""
    here = cells[column]
    remaining = {k for k in row_keys if k not in here}
    imputed: dict[int, float] = {}
    fallback: dict[int, float] = {}  # nearest holder's own value
    for donor in donors if remaining else ():
        there = cells[donor]
        holds = remaining.intersection(there)
        if not holds:
            continue
        for k in holds:
            fallback.setdefault(k, there[k][0])
        shared = [r for r in here if r in there]
        if not shared:
            continue
        # statistics.median: the same value as np.median, faster on short lists
        if mode == "scale":
            ratio = float(statistics.median([here[r][0] / there[r][0] for r in shared]))
            for k in holds:
                imputed[k] = there[k][0] * ratio
        else:
            shift = float(statistics.median([here[r][0] - there[r][0] for r in shared]))
            ratio = None
            for k in holds:
                if there[k][0] + shift > 0.0:
                    imputed[k] = there[k][0] + shift
                    continue
                # A shift larger than the donor's own cost: the additive model fails here,
                # so scale instead (a cell near zero would draw the whole of a refreshed
                # step time's split away from it for good).
                if ratio is None:
                    ratio = float(statistics.median([here[r][0] / there[r][0]
                                                     for r in shared]))
                imputed[k] = there[k][0] * ratio
        remaining.difference_update(holds)
        if not remaining:
            break
    return [here[k][0] if k in here else imputed.get(k, fallback.get(k, math.nan))
            for k in row_keys]


def _log_distance(a: int, b: int) -> float:
    return abs(math.log2(a + 1) - math.log2(b + 1))
