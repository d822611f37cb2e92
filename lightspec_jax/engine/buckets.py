"""Bucket sizes, ahead-of-time compiled device steps looked up by bucket, and a recompile guard.

Every bucket size of the engine comes from the generators here: prefill rows, verify rows
(also the plain decode step's rows) and slot-write counts. Every device step is compiled at start-up with `jax.jit(f).lower(args).compile()`. The
compiled executables cannot re-trace: a wrong shape raises TypeError. Anything else that
compiles while serving (a stray jnp op on the host path, a pytree that changed structure) is
caught by `CompileWatch`, which counts JAX's own compile events.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any, Callable, Hashable, Iterable

import jax
from jax import monitoring

_COMPILE_EVENT_PREFIX = "/jax/core/compile/"


def powers_of_two(top: int, *, start: int = 1, base: int = 2) -> tuple[int, ...]:
    """start, base start, base^2 start, ... below `top`, and `top` itself (prefill rows, plain
    decode rows; slot writes use base 4: they are rare, so fewer executables beat tighter
    padding)."""
    out, b = {top}, start
    while b < top:
        out.add(b)
        b *= base
    return tuple(sorted(out))


def verify_buckets(max_rows: int) -> tuple[int, ...]:
    """Powers of two and their midpoints (1, 2, 3, 4, 6, 8, 12, ...) up to max_rows, inclusive."""
    out, b = {max_rows}, 1
    while b < max_rows:
        out.update(x for x in (b, b + b // 2) if x < max_rows)
        b *= 2
    return tuple(sorted(out))


def concurrency_buckets(concurrency: int, depth: int) -> tuple[int, ...]:
    """Verify buckets for `concurrency` slots up to full width:
    c x (1/4, 1/2, 1, 1.5, 2, 3, 4, 6, 8, 12) and c (K + 1).

    Fewer buckets than `verify_buckets` when the concurrency is known. The two below one row
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
        self._lock = threading.Lock()
        monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, name: str, duration: float, **kwargs) -> None:
        if name.startswith(_COMPILE_EVENT_PREFIX):
            with self._lock:
                self.count += 1


_counter: _CompileCounter | None = None


def compile_event_count() -> int:
    global _counter
    if _counter is None:
        _counter = _CompileCounter()
    return _counter.count


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
    """Compiled executables keyed by bucket; `pick(n)` rounds a row count up to a bucket."""

    def __init__(self, name: str, sizes: Iterable[int]):
        self.name = name
        self.sizes = tuple(sorted(set(sizes)))
        self._compiled: dict[Hashable, Any] = {}
        self.compile_seconds = 0.0

    def pick(self, n: int) -> int:
        i = bisect.bisect_left(self.sizes, n)
        if i == len(self.sizes):
            raise ValueError(f"{self.name}: {n} rows exceed the largest compiled bucket "
                             f"{self.sizes[-1]} (buckets {self.sizes})")
        return self.sizes[i]

    def compile(self, key: Hashable, fn: Callable, *abstract_args, **jit_kwargs) -> None:
        start = time.perf_counter()
        self._compiled[key] = jax.jit(fn, **jit_kwargs).lower(*abstract_args).compile()
        self.compile_seconds += time.perf_counter() - start

    def __contains__(self, key: Hashable) -> bool:
        return key in self._compiled

    def __call__(self, key: Hashable, *args):
        try:
            executable = self._compiled[key]
        except KeyError:
            raise RecompileError(f"{self.name}: no compiled executable for bucket {key!r}; "
                                 f"compiled: {sorted(self._compiled)}") from None
        return executable(*args)


def enable_compilation_cache(directory: str | None) -> None:
    """Turns on JAX's persistent compilation cache (all entries, however quick to compile)."""
    if directory is None:
        return
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
