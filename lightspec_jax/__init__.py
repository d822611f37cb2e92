"""lightspec_jax: training-free dynamic speculative decoding (LightSpec) in JAX."""

from .config import EngineConfig, Policy, SamplingParams, SpeculativeConfig
from .engine import Engine
from .request import FinishReason, RequestError, RequestOutput

__version__ = "0.1.0"

__all__ = ["Engine", "EngineConfig", "FinishReason", "Policy", "RequestError", "RequestOutput",
           "SamplingParams", "SpeculativeConfig"]
