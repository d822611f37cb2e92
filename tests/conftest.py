"""Shared fixtures: tiny Hugging Face Qwen3 checkpoints built on the fly (nothing downloaded)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite compiles hundreds of tiny engines, and on the CPU compiling is most of its time:
# with LLVM at optimization level 1 (XLA's default is 2) the files tried compiled and ran 6-11%
# faster (BENCHMARKS.md, "The test suite's time"), and XLA:CPU's older loop emitters (its MLIR
# fusion emitters off) compile an engine's steps in about 0.7x the time (BENCHMARKS.md,
# "Thirty-second session"). Every comparison the tests make is between programs compiled
# alike, in one process or in child processes, which inherit the flags.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=1"
                               + " --xla_cpu_use_fusion_emitters=false").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

from hf_fixtures import TinySpec, build_hf_qwen3  # noqa: E402

_CACHE_DIR = os.environ.get("LIGHTSPEC_TEST_JAX_CACHE",
                            os.path.join(os.path.dirname(__file__), "..", ".jax_cache"))
jax.config.update("jax_compilation_cache_dir", os.path.abspath(_CACHE_DIR))
# An engine built with the default EngineConfig turns on the user's caches under
# XDG_CACHE_HOME (compiled programs and measured cost tables, ~/.cache/lightspec_jax), and
# that switch holds for the rest of the process: the suite read and wrote the developer's
# caches, its planners could start from their cost tables, and a run "with an empty cache"
# still hit them. Here everything the suite caches stays beside its own compilation cache
# (child processes inherit it).
os.environ["XDG_CACHE_HOME"] = os.path.join(os.path.abspath(_CACHE_DIR), "home")
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_collection_modifyitems(config, items):
    """The `slow` checks (minutes each, in child processes) run first. With the README's
    two workers (pytest-xdist, --dist worksteal) they start at once, and the other worker
    takes the rest of the suite in the meantime; last in the queue, one of them would end
    the run alone. The sort is stable: every other test keeps its place."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True, scope="module")
def _drop_jit_caches():
    """XLA:CPU maps each executable's code into memory on its own, and the kernel caps a
    process's memory maps (vm.max_map_count, usually 65530): the whole suite in one process
    passed that cap and crashed inside XLA (mmap failing, a segfault at ~65k maps). JAX's jit
    caches (eager ops, kernels' many interpret-mode shapes) are dropped after each module; the
    engines that session fixtures keep hold their executables themselves and are untouched."""
    yield
    jax.clear_caches()


# Variants the parity tests sweep: tied/untied, sharded/single, rope theta != 1e4,
# head_dim != hidden/heads (32 != 64/4).
CHECKPOINTS = {
    "untied_sharded": TinySpec(tied=False, shard_size="50KB", rope_theta=12345.0),
    "tied_single": TinySpec(tied=True, shard_size=None, rope_theta=1_000_000.0),
}
# A target with peaked output distributions, so temperature-1 sampling has structure.
SHARP = TinySpec(tied=False, logit_scale=40.0, seed=1)


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """name -> (directory, transformers model in eval mode, fp32, eager attention)."""
    out = {}
    for name, spec in CHECKPOINTS.items():
        out[name] = build_hf_qwen3(str(tmp_path_factory.mktemp(name)), spec)
    return out


@pytest.fixture(scope="session")
def sharp_checkpoint(tmp_path_factory):
    return build_hf_qwen3(str(tmp_path_factory.mktemp("sharp")), SHARP)


@pytest.fixture(scope="session", params=sorted(CHECKPOINTS))
def hf_checkpoint(request, hf_checkpoints):
    return hf_checkpoints[request.param]
