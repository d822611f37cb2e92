"""Hugging Face DSpark drafters (the deepseek-ai/DeepSpec layout) -> our DSpark module.

Layout (reference/checkpoint-formats.md §6; DeepSpec `deepspec/modeling/dspark/qwen3/config.py`
build_draft_config and `.../qwen3/modeling.py` Qwen3DSparkModel): config.json is the target's
Qwen3 config with architectures ["Qwen3DSparkModel"], num_hidden_layers the draft layers, and
top-level block_size, target_layer_ids (-1: the embedding output), mask_token_id,
num_target_layers, num_anchors (training only), markov_rank (+ markov_head_type when > 0),
enable_confidence_head (+ confidence_head_with_markov when true). Tensors: DFlash's set without
a `model.` prefix, plus `markov_head.markov_w1.weight` [V, r] (an nn.Embedding),
`markov_head.markov_w2.weight` [V, r] (an nn.Linear r -> V) and
`confidence_head.proj.weight` [1, H(+r)] / `.bias` [1]. The embed_tokens and lm_head DeepSpec
saves are frozen copies of the target's, which serve instead; they are ignored.

The body's tables, checks and writer are DFlash's (checkpoint/dflash.py); this file adds the
config fields and the heads' rows.
"""

from __future__ import annotations

from typing import Any, Mapping

from lightspec_jax.models import DSpark, DSparkConfig, Qwen3Config
from lightspec_jax.models.config import ConfigError

from .dflash import (GLOBAL_MAP, body_fields, load_block_drafter, read_checked_config,
                     save_block_drafter)
from .qwen3 import IDENTITY, TRANSPOSE

ARCHITECTURES = ("Qwen3DSparkModel",)
MARKOV_MAP = {
    "markov_head.markov_w1.weight": ("markov_w1", IDENTITY),  # [V, r]
    "markov_head.markov_w2.weight": ("markov_w2", TRANSPOSE),  # torch [V, r] -> [r, V]
}
CONFIDENCE_MAP = {
    "confidence_head.proj.weight": ("confidence_w", TRANSPOSE),  # torch [1, F] -> [F, 1]
    "confidence_head.proj.bias": ("confidence_b", IDENTITY),  # [1]
}


def is_dspark_config(hf: Mapping[str, Any]) -> bool:
    return any(a in ARCHITECTURES for a in hf.get("architectures") or [])


def tensor_map(cfg: DSparkConfig) -> dict:
    """HF name -> (our path, transform) of the unstacked tensors this drafter has."""
    return {**GLOBAL_MAP, **(MARKOV_MAP if cfg.markov_rank else {}),
            **(CONFIDENCE_MAP if cfg.confidence_head else {})}


def read_dspark_config(directory: str, *, target_config: Qwen3Config) -> DSparkConfig:
    """Parses a DSpark config.json and checks it against the target it will draft for."""
    return read_checked_config(directory, _parse_config, target_config)


def _parse_config(hf: Mapping[str, Any], target: Qwen3Config) -> DSparkConfig:
    if not is_dspark_config(hf):
        raise ConfigError(f"architectures={hf.get('architectures')!r} is not a DSpark drafter "
                          f"(expected {list(ARCHITECTURES)})")
    body = body_fields(hf, target, name="DSpark")
    # DeepSpec's Qwen3DSparkModel asserts the same fields (num_anchors aside: training only).
    for key, why in (("target_layer_ids", "the target layers whose outputs it reads"),
                     ("mask_token_id", "the id that fills a block after its first token"),
                     ("markov_rank", "0 when it has no Markov head"),
                     ("enable_confidence_head", "whether it has a confidence head")):
        if key not in hf:
            raise ConfigError(f"config.json lacks required field {key!r} ({why})")
    rank = hf["markov_rank"]
    if rank and "markov_head_type" not in hf:
        raise ConfigError(f"markov_head_type is missing with markov_rank={rank}")
    confidence = bool(hf["enable_confidence_head"])
    if confidence and "confidence_head_with_markov" not in hf:
        raise ConfigError("confidence_head_with_markov is missing with "
                          "enable_confidence_head=true")
    return DSparkConfig(**body, target_layer_ids=tuple(int(i) for i in hf["target_layer_ids"]),
                        mask_token_id=int(hf["mask_token_id"]), markov_rank=rank,
                        markov_head_type=str(hf.get("markov_head_type", "vanilla")).lower(),
                        confidence_head=confidence,
                        confidence_head_with_markov=bool(
                            confidence and hf["confidence_head_with_markov"]))


def load_dspark(directory: str, *, target_config: Qwen3Config, dtype="float32") -> DSpark:
    """Loads a DeepSpec DSpark drafter (model.safetensors, single or sharded) for a Qwen3
    target."""
    return load_block_drafter(directory, read_dspark_config, DSpark, tensor_map,
                              target_config=target_config, dtype=dtype)


def save_dspark_hf(model: DSpark, directory: str, *, num_target_layers: int | None = None,
                   num_anchors: int = 512) -> None:
    """Writes `model` in the DeepSpec layout through the tables `load_dspark` reads.
    num_target_layers (the target's L) is written when given; num_anchors is a training
    setting DeepSpec's model class requires in config.json."""
    cfg = model.config
    fields = {"architectures": list(ARCHITECTURES),
              "target_layer_ids": list(cfg.target_layer_ids),
              "mask_token_id": cfg.mask_token_id, "num_anchors": num_anchors,
              "layer_types": ["full_attention"] * cfg.num_layers,
              "markov_rank": cfg.markov_rank, "enable_confidence_head": cfg.confidence_head}
    if num_target_layers is not None:
        fields["num_target_layers"] = num_target_layers
    if cfg.markov_rank:
        fields["markov_head_type"] = cfg.markov_head_type
    if cfg.confidence_head:
        fields["confidence_head_with_markov"] = cfg.confidence_head_with_markov
    save_block_drafter(model, directory, tensor_map(cfg), fields)
