"""What a policy_ab variant's steps cost, from the step records it observed: wall time,
tokens and steps by kind of step, host and planner ms, the depths drafted, and a least-squares
fit of the loop's period on the rows of each step, and the full decode steps' periods by the
plan they ran (policy_ab.py --periods); the decode steps by how many requests they decoded
(`by_batch_size`, --by-size); and what each variant's full decode steps would cost at prices
common to every variant of the run (`common_prices`).

A step's record: (read time s, StepRecord, StepPlan) of each step read back, per repeat.
"""

from __future__ import annotations

import collections

import numpy as np


def summarize(repeats: list[list], concurrency: int) -> dict:
    """repeats: per repeat, (read time, StepRecord, StepPlan) of each step read back."""
    kinds = collections.defaultdict(lambda: [0, 0.0, 0])  # kind -> steps, ms, tokens
    for steps in repeats:
        for (before, _, _), (when, record, _) in zip(steps, steps[1:]):
            kind = ("prefill" if record.prefill_rows else
                    "full" if record.num_requests >= 0.75 * concurrency else
                    "tail" if record.num_requests else "empty")
            cell = kinds[kind]
            cell[0] += 1
            cell[1] += 1e3 * (when - before)
            cell[2] += record.emitted
    decode = [r for steps in repeats for _, r, _ in steps if r.verify_rows and not r.prefill_rows]
    plans = [p for steps in repeats for _, r, p in steps
             if r.verify_rows and not r.prefill_rows and p is not None and p.full_rows]
    return {"kinds": dict(kinds),
            # decode steps that verified fewer rows than the proposal's full width
            "trimmed": sum(p.fill_rows < p.full_rows for p in plans) / max(len(plans), 1),
            "plan_ms": float(np.mean([r.plan_ms for r in decode])) if decode else 0.0,
            "host_ms": float(np.mean([r.host_ms for r in decode])) if decode else 0.0,
            "depths": dict(sorted(collections.Counter(r.draft_depth for r in decode).items()))}


def period_fit(repeats: list[list]) -> list[str]:
    """Least squares, per kind of step, of the period between read-backs on prompt rows,
    verify rows and the draft rows before them (the previous plan's depth x requests)."""
    rows = []
    for steps in repeats:
        for (before, _, last), (when, record, plan) in zip(steps, steps[1:]):
            if plan is not None and last is not None and record.num_requests:
                rows.append((1e3 * (when - before), record.prefill_rows, record.verify_rows,
                             last.draft_depth * last.num_requests))
    out = []
    data = np.array(rows, float).reshape(-1, 4)
    for kind, mask in (("decode", data[:, 1] == 0), ("prefill", data[:, 1] > 0)):
        x = data[mask]
        if len(x) < 8:
            out.append(f"{kind}: {len(x)} steps, too few to fit")
            continue
        design = np.column_stack([np.ones(len(x)), x[:, 1], x[:, 2], x[:, 3]])
        coef = np.linalg.lstsq(design, x[:, 0], rcond=None)[0]
        resid = x[:, 0] - design @ coef
        r2 = 1.0 - (resid ** 2).sum() / max(((x[:, 0] - x[:, 0].mean()) ** 2).sum(), 1e-12)
        out.append(f"{kind}: {len(x)} steps, period ms = {coef[0]:.2f} + {coef[1]:.4f} x prompt"
                   f" rows + {coef[2]:.4f} x verify rows + {coef[3]:.4f} x draft rows "
                   f"(R^2 {r2:.2f}; mean {x[:, 0].mean():.1f} ms)")
    return out


def plan_periods(repeats: list[list], concurrency: int) -> list[str]:
    """The loop's period of each full decode step (decode only, at least 3/4 of the
    concurrency decoding, after a decode-only read-back) by what ran in it: the depth the
    previous step drafted, the depth this one verified and the depth it drafts ("floor" when
    all three are 0, what a floor step costs inside a run at the floor). Per cell: steps,
    mean and median period, tokens per ms."""
    cells = collections.defaultdict(list)  # (drafted, verified, drafts) -> [(ms, tokens)]
    for steps in repeats:
        for ms, record, plan, last in _full_decode_steps(steps, concurrency):
            cells[(last.draft_depth, plan.verified_depth, plan.draft_depth)].append(
                (ms, record.emitted))
    out = []
    for cell, xs in sorted(cells.items(), key=lambda kv: -len(kv[1])):
        ms, tokens = np.array(xs, float).T
        name = "floor" if cell == (0, 0, 0) else "drafted {} verified {} drafts {}".format(*cell)
        out.append(f"{name}: {len(xs)} steps, period {ms.mean():.2f} ms (median "
                   f"{np.median(ms):.2f}), {tokens.sum() / ms.sum():.2f} tok/ms")
    return out


def by_batch_size(repeats: list[list], concurrency: int) -> list[str]:
    """Each decode-only step after a decode-only read-back, by how many requests it decoded:
    bands from each power of two up to the next, and the full concurrency apart. Per band:
    steps, period ms a step, tokens a step, tokens per ms and the depths the steps verified.
    As a wave is admitted or drains, steps decode fewer requests than the concurrency; a
    policy whose requests finish on different steps spends more of its time there, and this
    says at what price a token (policy_ab.py --by-size)."""
    bands = collections.defaultdict(lambda: [0, 0.0, 0, collections.Counter()])
    for steps in repeats:
        for ms, record, plan, _ in _decode_steps(steps):
            n = record.num_requests
            band = bands[concurrency if n >= concurrency else 1 << (n.bit_length() - 1)]
            band[0] += 1
            band[1] += ms
            band[2] += record.emitted
            band[3][plan.verified_depth] += 1
    out = []
    for lo, (count, ms, tokens, depths) in sorted(bands.items()):
        hi = lo if lo == concurrency else min(2 * lo, concurrency) - 1
        size = f"N {lo}" if lo == hi else f"N {lo}-{hi}"
        out.append(f"{size}: {count} steps, {ms / count:.2f} ms a step, {tokens / count:.1f} "
                   f"tok a step, {tokens / ms:.2f} tok/ms, verified depths "
                   f"{dict(sorted(depths.items()))}")
    return out


def _decode_steps(steps: list):
    """(period ms, StepRecord, its plan, the previous step's plan) of each decode step of a
    repeat that decoded requests, ran no prompt chunk and came after a decode-only read-back:
    its period holds the drafting before it and its verify, nothing else."""
    for (before, previous, last), (when, record, plan) in zip(steps, steps[1:]):
        if (plan is None or last is None or not record.num_requests or record.prefill_rows
                or previous.prefill_rows):
            continue
        yield 1e3 * (when - before), record, plan, last


def _full_decode_steps(steps: list, concurrency: int):
    """_decode_steps with at least 3/4 of the concurrency decoding."""
    for step in _decode_steps(steps):
        if step[1].num_requests >= 0.75 * concurrency:
            yield step


def common_prices(runs: dict[str, list[list]], concurrency: int) -> dict[str, tuple]:
    """What each variant's full decode steps cost at prices common to the run: each step priced
    at the median period, over every variant and repeat, of the steps of its cell (its verify
    bucket and the depth the step before drafted - what the period between two read-backs
    holds, as the planner's calibration keys it). The machine's speed moves by 10-30% between
    repeats here, and each variant met it at other times; at common prices what is left is the
    variants' choices: how many steps, of which cells, for the tokens they committed.

    runs: label -> repeats (summarize's). Returns label -> (steps, ms at common prices, tokens,
    ms as measured)."""
    cells = collections.defaultdict(list)  # (bucket, depth drafted before) -> [period ms]
    mine = {}
    for label, repeats in runs.items():
        mine[label] = [(ms, (record.verify_rows, last.draft_depth), record.emitted)
                       for steps in repeats for ms, record, _, last in
                       _full_decode_steps(steps, concurrency)]
        for ms, cell, _ in mine[label]:
            cells[cell].append(ms)
    price = {cell: float(np.median(ms)) for cell, ms in cells.items()}
    return {label: (len(xs), sum(price[cell] for _, cell, _ in xs), sum(t for _, _, t in xs),
                    sum(ms for ms, _, _ in xs)) for label, xs in mine.items()}
