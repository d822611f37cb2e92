"""Qwen3 architecture configuration: a frozen, keyword-only description read from config.json.

Field names follow our own spelling; `from_hf` maps the Hugging Face keys (both the v4
`rope_theta` and the v5 `rope_parameters` spellings) and refuses what the model cannot run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM",)


class ConfigError(ValueError):
    """A checkpoint configuration that this library cannot run, with the offending field."""


def check_attention_fields(cfg, sizes: tuple[str, ...]) -> None:
    """Positive sizes, GQA-compatible head counts and a RoPE-able head_dim, or ConfigError."""
    for name in (*sizes, "num_heads", "num_kv_heads", "head_dim"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError(f"num_heads ({cfg.num_heads}) must be a multiple of num_kv_heads "
                          f"({cfg.num_kv_heads}) for grouped-query attention")
    if cfg.head_dim % 2:
        raise ConfigError(f"head_dim must be even for rotary embeddings, got {cfg.head_dim}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # explicit in Qwen3: never hidden_size // num_heads (4B: 2560/32 != 128)
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        check_attention_fields(self, ("vocab_size", "hidden_size", "intermediate_size",
                                      "num_layers"))

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA): query head j reads KV head j // group_size."""
        return self.num_heads // self.num_kv_heads

    @property
    def default_aux_layers(self) -> tuple[int, int, int]:
        """Eagle3's feature layers: the residual stream entering layers 2, L//2 and L-3."""
        n = self.num_layers
        return (2, n // 2, n - 3)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "Qwen3Config":
        """Reads a Hugging Face Qwen3 config.json dict; raises ConfigError naming the field."""
        archs = hf.get("architectures") or []
        model_type = hf.get("model_type")
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs) and model_type != "qwen3":
            raise ConfigError(
                f"unsupported architecture: architectures={archs!r}, model_type={model_type!r}; "
                f"expected one of {SUPPORTED_ARCHITECTURES} (model_type 'qwen3')")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if key not in hf:
                raise ConfigError(f"config.json lacks required field {key!r}")
        if hf.get("use_sliding_window"):
            raise ConfigError(
                "use_sliding_window=true is not supported (every released dense Qwen3 uses full "
                f"attention); got sliding_window={hf.get('sliding_window')!r}, "
                f"max_window_layers={hf.get('max_window_layers')!r}")
        if hf.get("attention_bias"):
            raise ConfigError("attention_bias=true is not supported: Qwen3 projections have no bias")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"hidden_act={act!r} is not supported; Qwen3 uses 'silu'")
        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rope_theta=rope_theta_from_hf(hf),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=hf.get("max_position_embeddings", 40960),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    def to_hf(self) -> dict[str, Any]:
        """The transformers-compatible config.json dict (writes both rope spellings)."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "use_sliding_window": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": (None if not self.eos_token_ids else self.eos_token_ids[0]
                             if len(self.eos_token_ids) == 1 else list(self.eos_token_ids)),
        }


def rope_theta_from_hf(hf: Mapping[str, Any], default: float | None = None) -> float:
    """RoPE base from either spelling: v4 top-level `rope_theta`, or v5 `rope_parameters`.

    Only plain RoPE is implemented: YaRN and other scalings change inv_freq and would give
    silently wrong logits, so they are refused.
    """
    params = hf.get("rope_parameters")
    scaling = hf.get("rope_scaling")
    for name, block in (("rope_parameters", params), ("rope_scaling", scaling)):
        if isinstance(block, Mapping):
            kind = block.get("rope_type", block.get("type", "default"))
            if kind not in ("default", None):
                raise ConfigError(f"{name}.rope_type={kind!r} is not supported; only default RoPE")
    if isinstance(params, Mapping) and "rope_theta" in params:
        return float(params["rope_theta"])
    if "rope_theta" in hf:
        return float(hf["rope_theta"])
    if default is not None:
        return default
    raise ConfigError("config.json has neither rope_theta nor rope_parameters.rope_theta")


def _preset(**kw) -> Qwen3Config:
    shared = dict(vocab_size=151936, head_dim=128, rope_theta=1_000_000.0, num_kv_heads=8,
                  bos_token_id=151643, eos_token_ids=(151645,))
    shared.update(kw)
    return Qwen3Config(**shared)


# Released dense sizes (reference/checkpoint-formats.md §1.4); checked with jax.eval_shape only.
PRESETS: dict[str, Qwen3Config] = {
    "qwen3-0.6b": _preset(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                          tie_word_embeddings=True),
    "qwen3-1.7b": _preset(hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
                          tie_word_embeddings=True),
    "qwen3-4b": _preset(hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
                        tie_word_embeddings=True),
    "qwen3-8b": _preset(hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32),
    "qwen3-14b": _preset(hidden_size=5120, intermediate_size=17408, num_layers=40, num_heads=40),
    "qwen3-32b": _preset(hidden_size=5120, intermediate_size=25600, num_layers=64, num_heads=64),
    # For tests: head_dim != hidden/heads, and L = 8 keeps Eagle3's layers 2, L//2, L-3 distinct
    # (2, 4, 5; at L = 6 the last two coincide).
    "tiny": Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=8,
                        num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=1_000_000.0,
                        max_position_embeddings=1024),
}
