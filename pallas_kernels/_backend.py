"""Route selection and Triton tuning shared by the speculative-decoding kernels.

Production picks the Pallas kernel only on a GPU: interpret mode on CPU is slow and erratic at
real shapes (see reference/jax-platform-notes.md), so CPU runs call the plain-jnp reference.
Tests force the kernel with ``impl="pallas", interpret=True``.

GPU kernels go through the Triton route: jax 0.10.2 picks Mosaic GPU unless a Triton
``CompilerParams`` is passed explicitly, and the same Triton kernels still lower on 0.11/0.12.
Triton wants power-of-two tensor sizes, so ops pad their axes with ``pow2_at_least``.
"""

from __future__ import annotations

import contextlib
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

# Unset: the ops run their Pallas kernels on a GPU only. "interpret": on every backend,
# interpreted where no GPU is (the CPU tests of the kernels inside the engine, on one device or
# a mesh). "compiled": on every backend, compiled for a GPU - only for jax.export for CUDA from
# a machine without one (benchmarks/tp_plan.py), since nothing else can run them there.
KERNELS_ENV = "LIGHTSPEC_KERNELS"

# The verify width K+1 is at most 16 (LightSpec's MTP limit); every op pads it to exactly this.
MAX_WIDTH = 16
# The mesh axis that tensor parallelism splits heads over (engine/sharding.py names it).
MODEL_AXIS = "model"


def _kernels_everywhere() -> str:
    """LIGHTSPEC_KERNELS: "", "interpret" or "compiled" (read at trace time)."""
    value = os.environ.get(KERNELS_ENV, "")
    if value not in ("", "interpret", "compiled"):
        raise ValueError(f"{KERNELS_ENV} must be unset, 'interpret' or 'compiled', got "
                         f"{value!r}")
    return value


@contextlib.contextmanager
def op_routes(*, reference=None, mosaic=None, kernels: str | None = None):
    """Inside the block, LIGHTSPEC_REFERENCE_OPS names the ops in ``reference``,
    LIGHTSPEC_MOSAIC_OPS those in ``mosaic``, and LIGHTSPEC_KERNELS is ``kernels`` ("" unsets
    it); an argument left None leaves its variable as it is. The ops read these when traced,
    and a traced op is reused by later traces whatever they say, so jax's caches are dropped
    on entry and on exit."""
    settings = {REFERENCE_OPS_ENV: reference, MOSAIC_OPS_ENV: mosaic, KERNELS_ENV: kernels}
    settings = {name: value if isinstance(value, str) else ",".join(sorted(value))
                for name, value in settings.items() if value is not None}
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    jax.clear_caches()
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        jax.clear_caches()


def use_pallas(impl: Impl = None, *, interpret: bool = False, op: str | None = None) -> bool:
    """Whether an op should run its Pallas kernel (True) or its jnp reference (False).

    ``impl=None`` means: the kernel on a GPU backend, the reference elsewhere, unless
    ``interpret=True`` asks for the kernel in interpret mode, LIGHTSPEC_KERNELS asks for the
    kernels everywhere, or LIGHTSPEC_REFERENCE_OPS names ``op``. An explicit ``impl`` wins
    over all of them.
    """
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if impl == "mosaic" and op is not None and op not in MOSAIC_OPS:
        raise ValueError(f"{op} has no Mosaic GPU kernel (ops that do: {', '.join(MOSAIC_OPS)})")
    if impl is not None:
        return impl != "reference"
    if op is not None and op in reference_ops():
        return False
    return interpret or jax.default_backend() == "gpu" or bool(_kernels_everywhere())


def interpreted(impl: Impl, interpret: bool) -> bool:
    """Whether the kernel an op runs is interpreted: when asked, or when LIGHTSPEC_KERNELS=
    interpret chose it where no GPU is. (An explicit ``impl="pallas"`` off a GPU without
    ``interpret`` is the compiled kernel: what jax.export lowers for CUDA on a CPU.)"""
    return interpret or (impl is None and _kernels_everywhere() == "interpret"
                         and jax.default_backend() != "gpu")


def on_local_shards(fn, in_specs, out_specs):
    """`fn` (a kernel call) as each device's call on its own shards, when the context mesh
    splits MODEL_AXIS under GSPMD (tensor parallelism); `fn` itself otherwise.

    A Pallas kernel is one opaque custom call, which GSPMD cannot split: it would gather every
    operand whole onto each device. Under jax.shard_map, manual over MODEL_AXIS only, each
    device runs the kernel on its local shards (specs naming MODEL_AXIS, e.g. attention heads)
    or on its whole copy (P(): the small per-slot arrays every device holds). The engine lowers
    its steps under its mesh (jax.set_mesh), and a data-parallel step's shard_map is manual over
    'data' already, so the context mesh says what is still split automatically.
    """
    if model_parallel_size() == 1:
        return fn
    return jax.shard_map(fn, mesh=jax.sharding.get_abstract_mesh(), in_specs=in_specs,
                         out_specs=out_specs, axis_names={MODEL_AXIS}, check_vma=False)


def model_parallel_size() -> int:
    """M: the devices the context mesh splits MODEL_AXIS over under GSPMD (1: none)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or MODEL_AXIS not in mesh.axis_names or MODEL_AXIS in mesh.manual_axes:
        return 1
    return mesh.shape[MODEL_AXIS]


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
