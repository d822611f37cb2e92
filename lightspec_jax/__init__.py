"""lightspec_jax: training-free dynamic speculative decoding (LightSpec) in JAX."""

__version__ = "0.1.0"
