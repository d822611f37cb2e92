"""Ratios of interleaved repeats: a variant's tok/s against a reference served beside it,
repeat by repeat (policy_ab.py; benchmarks/results/long-readings-fiftyfourth/cell_table.py).
"""

from __future__ import annotations

import numpy as np


def ratio_interval(tok_s, reference, *, draws: int = 4000, seed: int = 0
                   ) -> tuple[float, float, float]:
    """(median of the per-repeat ratios, and the 2.5th and 97.5th percentiles of the ratio of
    mean tok/s) of a variant's repeats ([R] tok/s) to the reference's ([R], the same repeats):
    the repeats resampled with replacement, each kept with its reference (a paired bootstrap).
    On this shared machine one repeat of a variant can run 0.7-1.35x the reference beside it,
    so a ratio of means over a few repeats moves by 5% or more between runs; the interval says
    how far this run's can be trusted."""
    v, r = np.asarray(tok_s, float), np.asarray(reference, float)
    picks = np.random.default_rng(seed).integers(0, len(v), size=(draws, len(v)))  # [draws, R]
    means = v[picks].mean(axis=1) / r[picks].mean(axis=1)  # [draws]
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(np.median(v / r)), float(lo), float(hi)


def over_best(tok_s: dict[str, list[float]]) -> dict[str, tuple]:
    """label -> (the best other label, ratio of mean tok/s, median, 2.5th and 97.5th
    percentiles: ratio_interval) of each variant against the best of the others by mean
    tok/s - the bar a dynamic policy is held to. tok_s: label -> [R] tok/s, the same R
    repeats for every label."""
    means = {label: float(np.mean(x)) for label, x in tok_s.items()}
    out = {}
    for label in tok_s:
        best = max((m, other) for other, m in means.items() if other != label)[1]
        out[label] = (best, means[label] / means[best],
                      *ratio_interval(tok_s[label], tok_s[best]))
    return out
