"""Bucket sizes, ahead-of-time compiled device steps looked up by bucket, and a recompile guard.

Every bucket size of the engine comes from the generators here: prefill rows, verify rows
(also the plain decode step's rows) and slot-write counts. Every device step is defined at
start-up by its key, function and abstract arguments, and compiled with
`jax.jit(f).lower(args).compile()` (on a GPU with `compiler_options()`): at start-up, or
(`lazy`) the first time it is called, for variants most runs never use (the sampling variants
of a step). The compiled executables cannot re-trace: a wrong shape raises TypeError. Anything
else that compiles while serving (a stray jnp op on the host path, a pytree that changed
structure) is caught by `CompileWatch`, which counts JAX's own compile events, less those of a
registry's own lazy compiles.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Hashable, Iterable

import jax
from jax import monitoring

_COMPILE_EVENT_PREFIX = "/jax/core/compile/"
log = logging.getLogger(__name__)

# XLA options every device step compiles with on a GPU, so the engine does not depend on the
# user's XLA_FLAGS for its speed. GEMMs go to cuBLAS: on the H200, XLA's Triton GEMMs with
# autotuning off ran the Qwen3-14B verify step at 13 TFLOP/s, cuBLAS at 47-74% of the bf16
# roofline (BENCHMARKS.md, "The H200 device check"). A flag the user's XLA_FLAGS names wins.
GPU_COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}


def compiler_options(backend: str | None = None) -> dict[str, Any]:
    """Per-executable XLA options for the engine's device steps on `backend` (default: JAX's):
    GPU_COMPILER_OPTIONS on a GPU, less the flags XLA_FLAGS sets; none elsewhere."""
    if (backend or jax.default_backend()) != "gpu":
        return {}
    user_flags = os.environ.get("XLA_FLAGS", "")
    return {k: v for k, v in GPU_COMPILER_OPTIONS.items() if f"--{k}=" not in user_flags}


def powers_of_two(top: int, *, start: int = 1, base: int = 2) -> tuple[int, ...]:
    """start, base start, base^2 start, ... below `top`, and `top` itself (prefill rows, plain
    decode rows; slot writes use base 4: they are rare, so fewer executables beat tighter
    padding)."""
    out, b = {top}, start
    while b < top:
        out.add(b)
        b *= base
    return tuple(sorted(out))


def midpoint_buckets(top: int, *, start: int = 1) -> tuple[int, ...]:
    """start, 1.5 start, 2 start, 3 start, 4 start, ... below `top`, and `top` itself: powers
    of two from `start` and their midpoints, so padding a row count to its bucket wastes at
    most a third of the bucket (half with powers of two alone). Verify rows, and prefill rows
    by default: a lone prompt or two admitted beside decoding requests - every prompt at c = 1,
    most at c = 16 once requests end on different steps - pads to its bucket, and with
    powers of two alone that padding cost the tiny pair about 2% of its throughput (-3% to
    +5% by cell; BENCHMARKS.md, "Forty-seventh session: prefill buckets at the midpoints")."""
    out, b = {top}, start
    while b < top:
        out.update(x for x in (b, b + b // 2) if x < top)
        b *= 2
    return tuple(sorted(out))


def concurrency_buckets(concurrency: int, depth: int) -> tuple[int, ...]:
    """Verify buckets for `concurrency` slots up to full width:
    c x (1/4, 1/2, 1, 1.5, 2, 3, 4, 6, 8, 12) and c (K + 1).

    Fewer buckets than `midpoint_buckets` when the concurrency is known. The two below one row
    per request serve the steps with fewer requests in flight - while requests are admitted
    and prefilled, and as the last ones drain - which would otherwise pay for c rows."""
    top = concurrency * (depth + 1)
    sizes = {top}
    for factor in (0.25, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 12):
        rows = int(concurrency * factor)
        if 1 <= rows < top:
            sizes.add(rows)
    return tuple(sorted(sizes))


class RecompileError(RuntimeError):
    """Something was traced or compiled while serving; all device steps must be precompiled."""


class _CompileCounter:
    """Process-wide count of JAX trace/compile events (one listener, registered once)."""

    def __init__(self):
        self.count = 0
        self.declared = 0  # events of registries' lazy compiles (not serving-time surprises)
        self._lock = threading.Lock()
        monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, name: str, duration: float, **kwargs) -> None:
        if name.startswith(_COMPILE_EVENT_PREFIX):
            with self._lock:
                self.count += 1

    def declare(self, events: int) -> None:
        """Counts `events` as a registry's own lazy compile, not a serving-time recompile."""
        with self._lock:
            self.declared += events


_counter: _CompileCounter | None = None


def _compile_counter() -> _CompileCounter:
    global _counter
    if _counter is None:
        _counter = _CompileCounter()
    return _counter


def lazy_compile_events() -> int:
    """Compile events of registries' lazy compiles so far: a step() during which this moved
    spent part of its time compiling, not serving."""
    return _compile_counter().declared


def compile_event_count() -> int:
    """JAX trace/compile events so far, less those of declared lazy compiles."""
    counter = _compile_counter()
    return counter.count - counter.declared


class CompileWatch:
    """`with CompileWatch("step"):` raises RecompileError if JAX traced or compiled inside."""

    def __init__(self, what: str, enabled: bool = True):
        self.what = what
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            self._start = compile_event_count()
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.enabled and exc_type is None:
            new = compile_event_count() - self._start
            if new:
                raise RecompileError(
                    f"{new} JAX trace/compile event(s) during {self.what}: a serving-time "
                    "recompile; every device step must come from the precompiled registry "
                    "(run with jax.log_compiles(True) to see what compiled)")
        return False


class BucketRegistry:
    """Compiled executables keyed by bucket (or (bucket, variant)); `pick(n)` rounds a row
    count up to a bucket. `define` records how to compile a key; `build` compiles it."""

    def __init__(self, name: str, sizes: Iterable[int], *, mesh=None):
        """mesh: the engine's device mesh, if any; its steps are lowered under it
        (jax.set_mesh), so the Pallas ops can split their kernels over it
        (pallas_kernels.on_local_shards)."""
        self.name = name
        self.mesh = mesh
        self.sizes = tuple(sorted(set(sizes)))
        self._compiled: dict[Hashable, Any] = {}
        self._recipes: dict[Hashable, tuple] = {}  # key -> (fn, abstract args, jit kwargs)
        self._lazy: set[Hashable] = set()
        self.compile_seconds = 0.0

    def pick(self, n: int) -> int:
        i = bisect.bisect_left(self.sizes, n)
        if i == len(self.sizes):
            raise ValueError(f"{self.name}: {n} rows exceed the largest compiled bucket "
                             f"{self.sizes[-1]} (buckets {self.sizes})")
        return self.sizes[i]

    def define(self, key: Hashable, fn: Callable, *abstract_args, lazy: bool = False,
               **jit_kwargs) -> None:
        """How to compile `key`; a `lazy` key compiles at its first call, others in `build`."""
        self._recipes[key] = (fn, abstract_args, jit_kwargs)
        if lazy:
            self._lazy.add(key)

    def defer_all(self) -> None:
        """Every key defined so far compiles at its first call
        (EngineConfig.compile_on_first_use)."""
        self._lazy.update(self._recipes)

    @property
    def pending(self) -> list[Hashable]:
        """Defined keys to compile at start-up (not lazy, not compiled yet)."""
        return [k for k in self._recipes if k not in self._lazy and k not in self._compiled]

    def build(self, key: Hashable) -> Any:
        fn, abstract_args, jit_kwargs = self._recipes[key]
        start = time.perf_counter()
        with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
            lowered = jax.jit(fn, **jit_kwargs).lower(*abstract_args)
        executable = lowered.compile(compiler_options=compiler_options() or None)
        self._compiled[key] = executable
        self.compile_seconds += time.perf_counter() - start
        return executable

    def __contains__(self, key: Hashable) -> bool:
        return key in self._compiled

    @property
    def defined(self) -> list[Hashable]:
        """The keys it can run: compiled at start-up, or to compile at first use."""
        return list(self._recipes)

    @property
    def compiled(self) -> list[Hashable]:
        """The keys compiled so far."""
        return list(self._compiled)

    def __call__(self, key: Hashable, *args):
        executable = self._compiled.get(key)
        if executable is None:
            executable = self._build_lazy(key)
        return executable(*args)

    def _build_lazy(self, key: Hashable) -> Any:
        if key not in self._lazy:
            raise RecompileError(f"{self.name}: no compiled executable for {key!r}; "
                                 f"compiled: {sorted(self._compiled, key=repr)}")
        counter = _compile_counter()
        before, start = counter.count, time.perf_counter()
        executable = self.build(key)
        counter.declare(counter.count - before)
        log.info("%s: compiled %r on first use in %.1f s", self.name, key,
                 time.perf_counter() - start)
        return executable


def enable_compilation_cache(directory: str | None) -> None:
    """Turns on JAX's persistent compilation cache (all entries, however quick to compile)."""
    if directory is None:
        return
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
