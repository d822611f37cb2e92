"""The benchmark scripts (benchmarks/*.py, not a package), imported by the tests that check
them."""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_benchmark(name: str, *, register: bool = False):
    """benchmarks/<name>.py as a module. register: also under its name in sys.modules, where
    a dataclass defined in it looks its module up."""
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
