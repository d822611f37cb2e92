"""Step-time tables: milliseconds per forward keyed by compiled row count and batch context.

LightLLM (ModelTC/LightLLM, `mtp_speculative/planner`) times each CUDA graph once at start-up
with 2-token dummy contexts and never refreshes, so costs that grow with context are invisible
to it. Here a table starts from the same kind of profile and is refreshed online by an EMA of
measured step times, with a context axis. The planner's refresh moves each context column as a
whole (`update_level`), keeping the profile's shape across keys; `update` moves one cell.

* rows: lookup rounds up to the next key (a padded shape costs its bucket); above the largest
  key the cost is extrapolated linearly, cost_max * rows / rows_max.
* context (KV tokens attended, summed over the batch): columns sit on a geometric grid (four
  per doubling). An estimate interpolates linearly between the two columns around the context
  and is flat outside the measured range. A cell that was never measured in a column is imputed
  from the nearest column that has it, shifted by the median difference between the two columns
  on rows measured in both (impute.py).
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections.abc import Iterable, Mapping

import numpy as np

from .impute import donor_order, impute_column

_FORMAT = "lightspec-cost-table"
_GRID_PER_DOUBLING = 4


def snap_context(context_len: float) -> int:
    """Nearest context grid point: 0, then 2^(k/4) rounded (k >= 0)."""
    if not math.isfinite(context_len) or context_len < 0:
        raise ValueError(f"context_len must be a finite number >= 0, got {context_len}")
    if context_len < 0.5:
        return 0
    k = max(0, round(_GRID_PER_DOUBLING * math.log2(context_len)))
    return int(round(2.0 ** (k / _GRID_PER_DOUBLING)))


class CostTable:
    """Milliseconds per forward of one model, keyed by row count (and batch context).

    CostTable({rows: ms}) is context-free: context arguments are ignored. Passing
    `context_len=c0` declares the profile was taken at batch context c0 and turns on the
    context axis; later updates at other contexts add columns. `decay` is the EMA weight of the
    old value; a cell's first sample replaces its value.

    `impute` says how a column's unmeasured cells follow its measured ones: "shift" adds the
    median difference to the donor column (a forward whose context cost does not depend on its
    key, as the rows of one verify read each request's KV once), "scale" multiplies by the
    median ratio (a cost that grows with its key, as a draft stage keyed by depth re-reads the
    context once per depth).
    """

    def __init__(self, ms_by_rows: Mapping[int, float] | None = None, *,
                 context_len: int | None = None, decay: float = 0.9,
                 impute: str = "shift") -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if impute not in ("shift", "scale"):
            raise ValueError(f"impute must be 'shift' or 'scale', got {impute!r}")
        self.decay = float(decay)
        self.impute = impute
        self._context_axis = context_len is not None
        self._reference = snap_context(context_len) if self._context_axis else None
        # column (snapped context, or None for a context-free table) -> rows -> [ms, count]
        self._cells: dict[int | None, dict[int, list]] = {self._reference: {}}
        self._row_keys: list[int] = []
        # Derived lookups, rebuilt when stale. Per column, its cells over the row keys with
        # unmeasured ones imputed (a list), cleared on every update, since one cell moves the
        # imputation of others. Sorted columns and the donor order per column change only
        # when a column is added (columns are never removed).
        self._cache: dict[int | None, list] = {}
        # per column: samples by row key, then 0 (beyond the largest)
        self._counts: dict[int | None, list[int]] = {}
        # Where given row counts land among the row keys (plan() asks for the same buckets
        # every step): rows -> _position(rows), until a key is added.
        self._positions: dict[tuple, tuple] = {}
        self.version = 0  # bumped on every change: callers cache what they derive by it
        self._contexts_cache: tuple[int, tuple[int, ...]] | None = None
        self._donor_cache: dict[int | None, list] = {}
        for rows, ms in (ms_by_rows or {}).items():
            self._set(int(rows), self._reference, _check_ms(rows, ms), count=1)

    @classmethod
    def from_grid(cls, ms_by_context: Mapping[int, Mapping[int, float]], *,
                  decay: float = 0.9, impute: str = "shift") -> CostTable:
        """A table profiled at several contexts: {context_len: {rows: ms}}; the first is the
        reference context used when an estimate gives none."""
        if not ms_by_context:
            raise ValueError("ms_by_context is empty; give at least one context column")
        items = list(ms_by_context.items())
        table = cls(items[0][1], context_len=int(items[0][0]), decay=decay, impute=impute)
        for context, ms_by_rows in items[1:]:
            column = snap_context(int(context))
            table._cells.setdefault(column, {})
            for rows, ms in ms_by_rows.items():
                table._set(int(rows), column, _check_ms(rows, ms), count=1)
        return table

    # ---- queries ---------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return not self._row_keys

    @property
    def has_context_axis(self) -> bool:
        return self._context_axis

    @property
    def rows(self) -> tuple[int, ...]:
        """Row counts with at least one measurement, ascending."""
        return tuple(self._row_keys)

    @property
    def contexts(self) -> tuple[int, ...]:
        """Context columns (snapped), ascending; () for a context-free table."""
        cached = self._contexts_cache  # estimate() reads it on every call
        if cached is None or cached[0] != len(self._cells):
            cached = (len(self._cells), tuple(sorted(c for c in self._cells if c is not None)))
            self._contexts_cache = cached
        return cached[1]

    def estimate(self, rows: int, context_len: float | None = None) -> float:
        """Estimated ms of one forward over `rows` rows at batch context `context_len`."""
        self._require_keys()
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        i = bisect.bisect_left(self._row_keys, rows)
        if i < len(self._row_keys):
            return self._at_context(self._row_keys[i], context_len)
        largest = self._row_keys[-1]
        return self._at_context(largest, context_len) * rows / largest

    def estimate_many(self, rows: Iterable[int], context_len: float | None = None) -> np.ndarray:
        """estimate() for each row count; float64 array in the order given."""
        return np.array(self.read_many(rows, context_len)[0], dtype=np.float64)

    # ---- updates ---------------------------------------------------------------------------

    def update(self, rows: int, ms: float, context_len: float | None = None) -> None:
        """Fold one measured forward time into the table (EMA; first sample replaces).

        The sample lands on the smallest key >= rows, because a padded shape runs (and costs)
        its bucket; above the largest key, or in an empty table, `rows` becomes a new key.
        """
        ms = _check_ms(rows, ms)
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        i = bisect.bisect_left(self._row_keys, rows)
        key = self._row_keys[i] if i < len(self._row_keys) else int(rows)
        column = self._column_for(context_len)
        cell = self._cells.setdefault(column, {}).get(key)
        if cell is None:
            self._set(key, column, ms, count=1)
        else:
            cell[0] = self.decay * cell[0] + (1.0 - self.decay) * ms
            cell[1] += 1
            self._clear_caches()

    def update_level(self, rows: int, ms: float, context_len: float | None = None) -> None:
        """Fold one measured forward time in as a change of level of its context column: the
        cell holding `rows` moves by the EMA as update() moves it, and every other key of the
        column moves by the same factor, so the column keeps its shape - the start-up sweep's,
        which measured every key in turn. A column's first sample sets its cell as update()
        does, and the column's other keys take their imputed values (the nearest column
        shifted or scaled to it, `impute`), kept from then on.

        With update() each cell follows its own samples, and a cell is sampled only while the
        planner chooses it: one priced in a slow phase of a shared machine keeps that price
        until it is chosen again, which a dear price prevents. Over many runs the persistent
        table of the tiny pair's c = 1 engine drifted so that every draft depth cost alike at
        short contexts; side by side with a fresh sweep it drafted deeper and ran 1.5-3.5%
        slower (BENCHMARKS.md, "Forty-third session: the main job at c = 1 and 128")."""
        ms = _check_ms(rows, ms)
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        keys = self._row_keys
        column = self._column_for(context_len)
        if not keys or rows > keys[-1] or not self._cells.get(column):
            self.update(rows, ms, context_len)  # a new key, or a new column's first sample
            cells = self._cells[column]
            for key, value in zip(self._row_keys, self._vector(column)):
                cells.setdefault(key, [value, 0])
            self._clear_caches()
            return
        current = self._vector(column)  # [keys]: every key of a column is a cell once sampled
        at = bisect.bisect_left(keys, rows)
        ratio = self.decay + (1.0 - self.decay) * ms / current[at]  # the EMA at `rows`
        cells = self._cells[column]
        for key, value in zip(keys, current):
            count = (cells[key][1] if key in cells else 0) + (key == keys[at])
            cells[key] = [value * ratio, count]
        self._clear_caches()

    def count(self, rows: int, context_len: float | None = None) -> int:
        """Samples folded into the cell that holds `rows` at `context_len` (0 if none)."""
        if not self._row_keys:
            return 0
        counts = self._column_counts(self._column_for(context_len))  # [keys + 1]
        return counts[bisect.bisect_left(self._row_keys, rows)]  # 0 beyond the largest key

    def count_many(self, rows: Iterable[int], context_len: float | None = None) -> np.ndarray:
        """count() for each row count: [R] ints (plan() asks for every bucket at once)."""
        if not self._row_keys:
            return np.zeros(len(list(rows)), dtype=np.int64)
        return np.array(self._counts_of(self._position(rows), context_len), dtype=np.int64)

    def read_many(self, rows: Iterable[int], context_len: float | None = None
                  ) -> tuple[list[float], list[int]]:
        """(estimate_many(), count_many()) as lists: plan() reads every bucket of a table at
        each fresh decision, and a handful of values costs the host less as floats than as
        arrays."""
        self._require_keys()
        where = values, at, beyond = self._position(rows)
        if values and min(values) < 1:
            raise ValueError(f"rows must be >= 1, got {min(values)}")
        lo, w, hi = self._interpolation(context_len)
        low = self._vector(lo)
        if w is None:
            ms = [low[i] for i in at]
        else:
            high = self._vector(hi)
            ms = [(1.0 - w) * low[i] + w * high[i] for i in at]
        if any(beyond):  # cost_max * rows / rows_max, in estimate()'s order of operations
            largest = self._row_keys[-1]
            ms = [m * r / largest if b else m for m, r, b in zip(ms, values, beyond)]
        return ms, self._counts_of(where, context_len)

    # ---- persistence -----------------------------------------------------------------------

    def to_json(self) -> dict:
        columns = []
        for column in sorted(self._cells, key=lambda c: -1 if c is None else c):
            cells = self._cells[column]
            columns.append({
                "context_len": column,
                "rows": {str(r): cells[r][0] for r in sorted(cells)},
                "counts": {str(r): cells[r][1] for r in sorted(cells)},
            })
        return {"format": _FORMAT, "version": 1, "decay": self.decay, "impute": self.impute,
                "context_axis": self._context_axis, "reference_context": self._reference,
                "columns": columns}

    @classmethod
    def from_json(cls, data: Mapping) -> CostTable:
        """Inverse of to_json(); a plain {"rows": ms} mapping also loads (context-free)."""
        if data.get("format") != _FORMAT:
            try:
                return cls({int(r): float(ms) for r, ms in data.items()})
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"not a cost table: expected format {_FORMAT!r} or a {{rows: ms}} mapping "
                    f"({err})") from None
        if data.get("version") != 1:
            raise ValueError(f"unsupported cost table version {data.get('version')!r}; "
                             "this build reads version 1")
        axis = bool(data["context_axis"])
        table = cls(context_len=data["reference_context"] if axis else None,
                    decay=float(data["decay"]), impute=data.get("impute", "shift"))
        for col in data["columns"]:
            column = col["context_len"]
            if (column is None) == axis:
                raise ValueError(f"column context {column!r} contradicts context_axis={axis}")
            table._cells.setdefault(column, {})
            for r, ms in col["rows"].items():
                table._set(int(r), column, _check_ms(r, ms), count=int(col["counts"][r]))
        return table

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostTable:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))

    def __repr__(self) -> str:
        return (f"CostTable(rows={self._row_keys[:4]}{'...' if len(self._row_keys) > 4 else ''}, "
                f"contexts={len(self._cells)}, decay={self.decay})")

    # ---- internals -------------------------------------------------------------------------

    def _require_keys(self) -> None:
        if self.is_empty:
            raise ValueError("cost table is empty: profile at least one row count first "
                             "(planners check `is_empty` and plan full width until then)")

    def _clear_caches(self) -> None:
        self._cache.clear()
        self._counts.clear()
        self.version += 1

    def _set(self, rows: int, column: int | None, ms: float, *, count: int) -> None:
        self._cells.setdefault(column, {})[rows] = [ms, count]
        i = bisect.bisect_left(self._row_keys, rows)
        if i == len(self._row_keys) or self._row_keys[i] != rows:
            self._row_keys.insert(i, rows)
            self._positions.clear()
        self._clear_caches()

    def _position(self, rows: Iterable[int]) -> tuple[list[int], list[int], list[bool]]:
        """(rows [R], the key index each costs as [R], whether it lies beyond the largest key
        [R]); the table must hold a key. Cached by rows until a key is added (a plan() asks
        for the same buckets and depths every step)."""
        key = rows if isinstance(rows, tuple) else tuple(np.asarray(rows).ravel().tolist())
        hit = self._positions.get(key)
        if hit is None:
            if len(self._positions) >= 64:  # callers with ever new rows: stay small
                self._positions.clear()
            keys, last = self._row_keys, len(self._row_keys) - 1
            found = [bisect.bisect_left(keys, r) for r in key]
            hit = (list(key), [min(i, last) for i in found], [i > last for i in found])
            self._positions[key] = hit
        return hit

    def _counts_of(self, where: tuple, context_len: float | None) -> list[int]:
        """The samples of each cell `where` (_position) names, in the column of the context."""
        counts = self._column_counts(self._column_for(context_len))  # [keys + 1]
        _, at, beyond = where
        return [counts[-1] if b else counts[i] for i, b in zip(at, beyond)]

    def _column_for(self, context_len: float | None) -> int | None:
        if not self._context_axis:
            return None
        return self._reference if context_len is None else snap_context(context_len)

    def _at_context(self, key: int, context_len: float | None) -> float:
        if not self._context_axis:
            return self._cells[None][key][0]  # a context-free table measures every key
        lo, w, hi = self._interpolation(context_len)
        if w is None:
            return self._cell(key, lo)
        return (1.0 - w) * self._cell(key, lo) + w * self._cell(key, hi)

    def _interpolation(self, context_len: float | None) -> tuple:
        """(lo, w, hi): a context's ms is (1 - w) ms(lo) + w ms(hi) between the columns around
        it; (column, None, None) where one column answers."""
        if not self._context_axis:
            return None, None, None
        if context_len is None:
            return self._reference, None, None
        columns = self.contexts
        x = float(context_len)
        j = bisect.bisect_right(columns, x)
        if j == 0:
            return columns[0], None, None
        if j == len(columns):
            return columns[-1], None, None
        lo, hi = columns[j - 1], columns[j]
        return lo, (x - lo) / (hi - lo), hi

    def _cell(self, key: int, column: int) -> float:
        cell = self._cells[column].get(key)
        if cell is not None:
            return cell[0]
        return self._vector(column)[bisect.bisect_left(self._row_keys, key)]

    def _vector(self, column: int | None) -> list[float]:
        """A column over every row key, unmeasured cells imputed (impute.py; cached until an
        update)."""
        vec = self._cache.get(column)
        if vec is None:
            vec = impute_column(self._cells, column, self._row_keys,
                                self._donor_order(column), self.impute)
            self._cache[column] = vec
        return vec

    def _column_counts(self, column: int | None) -> list[int]:
        """Each row key's samples in `column`, then 0 (beyond the largest key): [keys + 1]
        (cached until the column changes)."""
        counts = self._counts.get(column)
        if counts is None:
            cells = self._cells.get(column, {})
            counts = [cells[k][1] if k in cells else 0 for k in self._row_keys] + [0]
            self._counts[column] = counts
        return counts

    def _donor_order(self, column: int | None) -> list:
        """Every other column, nearest (in log context) first; ties keep insertion order."""
        order = self._donor_cache.get(column)
        if order is None or len(order) != len(self._cells) - 1:
            order = donor_order(self._cells, column)
            self._donor_cache[column] = order
        return order


def _check_ms(rows, ms) -> float:
    ms = float(ms)
    if not math.isfinite(ms) or ms <= 0.0:
        raise ValueError(f"cost for {rows} rows must be a finite number of ms > 0, got {ms}")
    return ms
