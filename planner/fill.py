"""The survival fill rule: which draft rows a verify budget goes to (numpy, host side).

LightSpec's budget-then-fill (lightspec-algorithm.md §7): the host picks how many rows to
verify, and the fill picks which. Every request keeps its target row. Request i's draft position
j (1-based, j <= proposal_len[i]) scores

    survival[i, j] = prod_{m <= j} clip(conf[i, m-1], 0.01, 0.99)      (a NaN conf counts 0.01)

and the remaining budget of draft rows goes to the global top scores, ties to the lower flat
index (slot-major, i*K + j). The clip keeps survival strictly decreasing along a request, so
each request's selection is a prefix: the fill is fully described by drafts verified per request.

This module is the one statement of the rule. Its device form is pallas_kernels/fill.py
(`fill_reference` in jnp and the Pallas kernel, which run inside the jitted step and also lay
out the rows); tests/pallas_kernels/test_fill.py checks both against this module. The
simulator, the DSpark-style baseline and benchmarks/diagnose_dynamic.py call it.

Axis legend: N requests, K max draft depth.
"""

from __future__ import annotations

import numpy as np

CONF_MIN = 0.01
CONF_MAX = 0.99
NO_DRAFT = -np.inf  # the score of a position past a request's proposal


def clamp_confidence(conf: np.ndarray) -> np.ndarray:
    """clip(conf, CONF_MIN, CONF_MAX) with NaN as CONF_MIN: a broken drafter row must not
    outrank real ones. Keeps a float32 input float32 (as on the device); others become float64."""
    conf = np.asarray(conf)
    if conf.dtype != np.float32:
        conf = conf.astype(np.float64)
    return np.clip(np.where(np.isnan(conf), CONF_MIN, conf), CONF_MIN, CONF_MAX)


def survival_scores(conf: np.ndarray, proposal_len: np.ndarray) -> np.ndarray:
    """Survival score of every draft position, [N, K]; NO_DRAFT past each request's proposal.

    conf: [N, K] drafter top-1 probabilities; proposal_len: [N] drafts proposed (values outside
    [0, K] act as the nearest end). The product is a left fold in conf's precision, the device's
    order, so float32 scores equal the device's bit for bit.
    """
    conf = clamp_confidence(conf)
    if conf.ndim != 2:
        raise ValueError(f"confidences must be [N, K], got shape {conf.shape}")
    proposal_len = np.asarray(proposal_len)
    if proposal_len.shape != conf.shape[:1]:
        raise ValueError(f"proposal_len {proposal_len.shape} must be ({conf.shape[0]},) to "
                         f"match confidences {conf.shape}")
    position = np.arange(1, conf.shape[1] + 1)  # [K]
    proposed = position[None, :] <= proposal_len[:, None]  # [N, K]
    return np.where(proposed, np.cumprod(conf, axis=1), NO_DRAFT)  # [N, K]


def fill_lengths(conf: np.ndarray, proposal_len: np.ndarray, num_drafts: int) -> np.ndarray:
    """Drafts verified per request, [N] int64, when `num_drafts` draft rows (the verify rows
    left after every request's target row) go to the top survival scores. A budget of 0 or
    less verifies none; one beyond the proposed drafts verifies them all."""
    scores = survival_scores(conf, proposal_len)  # [N, K]
    n, k = scores.shape
    if num_drafts <= 0 or k == 0:
        return np.zeros(n, np.int64)
    flat = scores.reshape(-1)  # [N*K], slot-major
    top = np.argsort(-flat, kind="stable")[:num_drafts]  # stable: ties to the lower index
    top = top[flat[top] > NO_DRAFT]
    return np.bincount(top // k, minlength=n).astype(np.int64)
