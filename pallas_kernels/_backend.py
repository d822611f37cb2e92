"""Route selection and Triton tuning shared by the speculative-decoding kernels.

Production picks the Pallas kernel only on a GPU: interpret mode on CPU is slow and erratic at
real shapes (see reference/jax-platform-notes.md), so CPU runs call the plain-jnp reference.
Tests force the kernel with ``impl="pallas", interpret=True``.

GPU kernels go through the Triton route: jax 0.10.2 picks Mosaic GPU unless a Triton
``CompilerParams`` is passed explicitly, and the same Triton kernels still lower on 0.11/0.12.
Triton wants power-of-two tensor sizes, so ops pad their axes with ``pow2_at_least``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

import jax
from jax.experimental.pallas import triton as pl_triton

# "pallas": the op's Triton-route Pallas kernel; "mosaic": its Mosaic GPU kernel (only the ops
# in MOSAIC_OPS have one); "reference": its plain-jnp reference; None: chosen by backend and
# environment (use_pallas, use_mosaic).
Impl = Literal["pallas", "mosaic", "reference"] | None

_IMPLS = ("pallas", "mosaic", "reference", None)

# The ops with a Pallas kernel, by the name LIGHTSPEC_REFERENCE_OPS uses.
OPS = ("fill", "verify", "commit", "verify_attention")
# Comma-separated op names (or "all") whose jnp reference runs even on a GPU: the escape hatch
# when a kernel misbehaves on some GPU/jax combination (the device check uses it as fallback).
REFERENCE_OPS_ENV = "LIGHTSPEC_REFERENCE_OPS"
# The ops with a second GPU kernel written for Mosaic GPU, jax's Pallas backend on Hopper.
MOSAIC_OPS = ("verify_attention",)
# Comma-separated op names (or "all") that take their Mosaic GPU kernel on a GPU instead of the
# Triton one, where it supports the shapes and dtype (it falls back to Triton elsewhere). Off by
# default until an H200 measures it faster (BENCHMARKS.md).
MOSAIC_OPS_ENV = "LIGHTSPEC_MOSAIC_OPS"


def _named_ops(env: str, known: tuple[str, ...]) -> frozenset[str]:
    names = {n.strip() for n in os.environ.get(env, "").split(",") if n.strip()}
    if "all" in names:
        return frozenset(known)
    unknown = names - set(known)
    if unknown:
        raise ValueError(f"{env} names unknown ops {sorted(unknown)}; "
                         f"known: {', '.join(known)} or all")
    return frozenset(names)


def reference_ops() -> frozenset[str]:
    """The ops LIGHTSPEC_REFERENCE_OPS forces onto their reference (read at trace time)."""
    return _named_ops(REFERENCE_OPS_ENV, OPS)


def mosaic_ops() -> frozenset[str]:
    """The ops LIGHTSPEC_MOSAIC_OPS sends to their Mosaic GPU kernel (read at trace time)."""
    return _named_ops(MOSAIC_OPS_ENV, MOSAIC_OPS)

# The verify width K+1 is at most 16 (LightSpec's MTP limit); every op pads it to exactly this.
MAX_WIDTH = 16


def use_pallas(impl: Impl = None, *, interpret: bool = False, op: str | None = None) -> bool:
    """Whether an op should run its Pallas kernel (True) or its jnp reference (False).

    ``impl=None`` means: the kernel on a GPU backend, the reference elsewhere, unless
    ``interpret=True`` asks for the kernel in interpret mode or LIGHTSPEC_REFERENCE_OPS names
    ``op``. An explicit ``impl`` wins over both.
    """
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if impl == "mosaic" and op is not None and op not in MOSAIC_OPS:
        raise ValueError(f"{op} has no Mosaic GPU kernel (ops that do: {', '.join(MOSAIC_OPS)})")
    if impl is not None:
        return impl != "reference"
    if op is not None and op in reference_ops():
        return False
    return interpret or jax.default_backend() == "gpu"


def use_mosaic(impl: Impl, *, op: str) -> bool:
    """For an op that runs a kernel (use_pallas is True): its Mosaic GPU kernel (True) or its
    Triton one. ``impl="mosaic"`` asks for it; ``impl=None`` takes it where LIGHTSPEC_MOSAIC_OPS
    names ``op``."""
    return impl == "mosaic" or (impl is None and op in mosaic_ops())


def pow2_at_least(n: int, minimum: int = MAX_WIDTH) -> int:
    """The smallest power of two ≥ max(n, minimum): Triton block sizes must be powers of two.

    The floor of 16 keeps tiny test shapes away from degenerate 1- and 2-element tensors.
    """
    n = max(int(n), minimum, 1)
    return 1 << (n - 1).bit_length()


@dataclasses.dataclass(frozen=True, kw_only=True)
class TritonTuning:
    """A named Triton launch configuration (warps per program, software-pipeline stages)."""

    name: str
    num_warps: int
    num_stages: int = 1

    def compiler_params(self) -> pl_triton.CompilerParams:
        return pl_triton.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


# fill's selection is one program over the whole padded [N, 16] score tile (the top-B is
# global), so it gets the most warps; its loop carries state and gains nothing from pipelining.
FILL_TUNING = TritonTuning(name="fill_select", num_warps=8)
# fill's row layout: one [rows, N] comparison tile (8K elements) per program.
LAYOUT_TUNING = TritonTuning(name="fill_layout", num_warps=4)
# verify and commit work on independent blocks of slots: small programs, many of them.
SLOT_BLOCK_TUNING = TritonTuning(name="slot_block", num_warps=4)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionTuning(TritonTuning):
    """Triton launch plus tile sizes of the verify-attention kernel.

    block_kv: cache positions per loop step (a power of two; capped by S's largest
    power-of-two divisor). max_query_rows: the largest query tile M = rows x padded heads.
    """

    block_kv: int = 64
    max_query_rows: int = 128


# Memory-bound like decode attention: a 64 x 128 bf16 K and V block per step, 2 stages to keep
# the next block's load in flight, 4 warps for an M <= 128 query tile.
VERIFY_ATTENTION_TUNING = AttentionTuning(name="verify_attention", num_warps=4, num_stages=2,
                                          block_kv=64, max_query_rows=128)
