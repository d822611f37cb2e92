"""lightspec_jax: training-free dynamic speculative decoding (LightSpec) in JAX.

The serving API is imported lazily, so `import lightspec_jax.planner` (numpy only) never
loads jax.
"""

from __future__ import annotations

import importlib

from .config import EngineConfig, Policy, SamplingParams, SpeculativeConfig

__version__ = "0.1.0"

from .errors import RequestError

_LAZY = {
    "CheckpointError": ".checkpoint",
    "Engine": ".engine",
    "FinishReason": ".request",
    "RequestOutput": ".request",
    "StepEvent": ".engine",
}

__all__ = ["CheckpointError", "Engine", "EngineConfig", "FinishReason", "Policy", "RequestError",
           "RequestOutput", "SamplingParams", "SpeculativeConfig", "StepEvent"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
