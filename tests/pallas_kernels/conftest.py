"""Input generators and numpy models shared by the kernel tests; the fill's model is the host
rule itself, planner/fill.py.

Exposed as session fixtures returning plain functions, so hypothesis tests can use them too.
Axis legend: N slots, K max draft depth, B verify rows, S stop ids.

LIGHTSPEC_KERNELS_ON_DEVICE=1 (benchmarks/h200_check.py sets it on the H200) runs every kernel
test compiled on the GPU instead of interpreted: tests that ask for ``interpret=True`` get the
real Triton kernel, and ``kernel_kwargs`` says so to tests that take it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from jax.experimental import pallas as pl

from lightspec_jax.planner.fill import fill_lengths

ON_DEVICE = os.environ.get("LIGHTSPEC_KERNELS_ON_DEVICE", "") == "1"


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels_on_device():
    """On the device run, drop interpret=True from every pallas_call (the ops look up
    ``pl.pallas_call`` at trace time), so the existing interpret-mode tests test the GPU."""
    if not ON_DEVICE:
        yield
        return
    import jax

    if jax.default_backend() != "gpu":
        raise pytest.UsageError("LIGHTSPEC_KERNELS_ON_DEVICE=1 needs a GPU backend (set "
                                f"JAX_PLATFORMS=cuda); got {jax.default_backend()!r}")
    compiled = pl.pallas_call

    def pallas_call(*args, **kwargs):
        return compiled(*args, **{**kwargs, "interpret": False})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pl, "pallas_call", pallas_call)
        yield


@pytest.fixture(scope="session")
def kernel_kwargs():
    """How a test calls an op's kernel: interpreted on CPU, compiled on the device run."""
    return {"impl": "pallas", "interpret": not ON_DEVICE}


@pytest.fixture(scope="session")
def on_device():
    return ON_DEVICE

# Confidence values that exercise the clamp at both ends and produce exact ties across slots.
_EXTREME_CONFIDENCES = np.array([0.0, 0.001, 0.01, 0.5, 0.5, 0.9, 0.99, 0.995, 1.0], np.float32)


def make_fill_inputs(rng: np.random.Generator, n: int, k: int, num_rows: int, regime: str):
    """conf f32[N, K], proposal_len i32[N], active bool[N], with at most num_rows active slots.

    regime: "uniform" (random confidences), "ties" (a few repeated values incl. clamp
    extremes), "flat" (one value everywhere: every cross-slot comparison is a tie),
    "wild" (NaN confidences, proposal lengths outside [0, K]).
    """
    if regime == "uniform":
        conf = rng.random((n, k), dtype=np.float32)
    elif regime == "ties":
        conf = rng.choice(_EXTREME_CONFIDENCES, size=(n, k))
    elif regime == "flat":
        conf = np.full((n, k), rng.choice(_EXTREME_CONFIDENCES), np.float32)
    elif regime == "wild":
        conf = rng.random((n, k), dtype=np.float32)
        conf[rng.random((n, k)) < 0.2] = np.nan
    else:
        raise ValueError(regime)
    low, high = (-2, k + 3) if regime == "wild" else (0, k + 1)
    proposal_len = rng.integers(low, high, n).astype(np.int32)
    if regime == "flat":
        proposal_len[:] = k
    active = rng.random(n) < 0.75
    # Keep the precondition B >= active slots: deactivate the surplus at random.
    on = np.flatnonzero(active)
    if on.size > num_rows:
        active[rng.choice(on, on.size - num_rows, replace=False)] = False
    return conf.astype(np.float32), proposal_len, active


def rule_lengths(conf, proposal_len, active, num_rows) -> np.ndarray:
    """Drafts per slot [N] by the host rule, given the device fill's arguments: inactive slots
    propose nothing, and every active slot's target row comes out of the B rows first."""
    proposal_len = np.where(active, proposal_len, 0)
    return fill_lengths(conf, proposal_len, num_rows - int(np.sum(active)))


def rule_kept(conf, proposal_len, active, num_rows) -> set[tuple[int, int]]:
    """The (slot, offset) pairs the host rule keeps: each active slot's target row (offset 0)
    and its verified drafts."""
    lengths = rule_lengths(conf, proposal_len, active, num_rows)
    return {(int(i), j) for i in np.flatnonzero(active) for j in range(lengths[i] + 1)}


def make_fill_result(rng, n, k, num_rows, regime="uniform"):
    """A FillResult from random inputs, via the reference fill (numpy arrays)."""
    from lightspec_jax.pallas_kernels import fill

    conf, proposal_len, active = make_fill_inputs(rng, n, k, num_rows, regime)
    result = fill(conf, proposal_len, active, num_rows=num_rows, impl="reference")
    return type(result)(*(np.asarray(x) for x in result)), active


def make_verify_inputs(rng, fill_result, n, k, vocab=3):
    """target i32[B], draft i32[N, K] with a small vocab and targets copied from drafts often,
    so accepted lengths span 0..lengths."""
    b = fill_result.row_slot.shape[0]
    draft = rng.integers(0, vocab, (n, k)).astype(np.int32)
    target = rng.integers(0, vocab, (b,)).astype(np.int32)
    for r in np.flatnonzero(fill_result.row_valid):
        slot, offset = fill_result.row_slot[r], fill_result.row_offset[r]
        if offset < k and rng.random() < 0.7:
            target[r] = draft[slot, offset]
    return target, draft


@pytest.fixture(scope="session")
def fill_inputs():
    return make_fill_inputs


@pytest.fixture(scope="session")
def fill_by_rule():
    return rule_lengths


@pytest.fixture(scope="session")
def kept_by_rule():
    return rule_kept


@pytest.fixture(scope="session")
def random_fill_result():
    return make_fill_result


@pytest.fixture(scope="session")
def verify_inputs():
    return make_verify_inputs
