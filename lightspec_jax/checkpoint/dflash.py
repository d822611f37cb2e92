"""Hugging Face DFlash drafters (the z-lab layout) -> our DFlash module.

Layout (reference/checkpoint-formats.md §3 and §6; z-lab/dflash `model/dflash.py`):
config.json is a Qwen3 config with architectures ["DFlashDraftModel"], a top-level
`block_size`, and `dflash_config` {mask_token_id, target_layer_ids}; without target_layer_ids
the model uses the ids its class computes from `num_target_layers` and its own layer count.
Tensors carry no `model.` prefix: `fc.weight` [H, n*Ht], `hidden_norm.weight`, `norm.weight`,
and `layers.{i}.` + the Qwen3 decoder layer's names. No embedding and no lm_head are needed
(the target's serve); copies some exports include are ignored.

One name-map table (the Qwen3 loader's layer map and transforms), stacked over layers as the
Qwen3 loader does.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

import numpy as np
from flax import nnx

from lightspec_jax.models import DFlash, DFlashConfig, Qwen3Config, default_target_layer_ids
from lightspec_jax.models.config import ConfigError, rope_theta_from_hf

from .qwen3 import IDENTITY, LAYER_MAP, TRANSPOSE, _variable, fill_variables, resolve_dtype
from .safetensors_io import SINGLE_FILE, CheckpointError, TensorReader, read_json

ARCHITECTURES = ("DFlashDraftModel",)
# HF name -> (our path, transform); layers: HF suffix under `layers.{i}.` via LAYER_MAP.
GLOBAL_MAP = {
    "fc.weight": ("fc", TRANSPOSE),
    "hidden_norm.weight": ("hidden_norm", IDENTITY),
    "norm.weight": ("norm", IDENTITY),
}
# Copies of the target's tensors (the target's own serve) and buffers without parameters.
_IGNORED = re.compile(r"^(lm_head\.weight|embed_tokens\.weight|.*rotary_emb\.inv_freq)$")
_LAYER_KEY = re.compile(r"^layers\.(\d+)\.")


def is_dflash_config(hf: Mapping[str, Any]) -> bool:
    return (any(a in ARCHITECTURES for a in hf.get("architectures") or [])
            or "dflash_config" in hf)


def read_dflash_config(directory: str, *, target_config: Qwen3Config) -> DFlashConfig:
    """Parses a DFlash config.json and checks it against the target it will draft for."""
    return read_checked_config(directory, _parse_config, target_config)


def read_checked_config(directory: str, parse, target_config: Qwen3Config):
    """parse(config.json, target) -> a block drafter config, checked against the target;
    a ConfigError becomes a CheckpointError naming the file."""
    path = os.path.join(directory, "config.json")
    try:
        cfg = parse(read_json(path), target_config)
        cfg.check_target(target_config)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from e
    return cfg


def _parse_config(hf: Mapping[str, Any], target: Qwen3Config) -> DFlashConfig:
    if not is_dflash_config(hf):
        raise ConfigError(f"architectures={hf.get('architectures')!r} is not a DFlash drafter "
                          f"(expected {list(ARCHITECTURES)} or a dflash_config object)")
    body = body_fields(hf, target, name="DFlash")
    dflash = hf.get("dflash_config") or {}
    if not isinstance(dflash, Mapping):
        raise ConfigError(f"dflash_config must be an object, got {dflash!r}")
    mask = dflash.get("mask_token_id", hf.get("mask_token_id"))
    if mask is None:
        raise ConfigError("dflash_config.mask_token_id is missing: the id that fills a block "
                          "after its first token (151669 for Qwen3) cannot be guessed")
    ids = dflash.get("target_layer_ids")
    if ids is None:
        ids = default_target_layer_ids(hf.get("num_target_layers") or target.num_layers,
                                       body["num_layers"])
    return DFlashConfig(**body, target_layer_ids=tuple(int(i) for i in ids),
                        mask_token_id=int(mask))


def body_fields(hf: Mapping[str, Any], target: Qwen3Config, *, name: str) -> dict[str, Any]:
    """The block drafter body's DFlashConfig fields from a config.json (DFlash and DSpark
    share it: Qwen3 layers, a block, trained on the features of a given target), checked."""
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "block_size"):
        if key not in hf:
            raise ConfigError(f"config.json lacks required field {key!r}")
    if hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or []):
        raise ConfigError(f"sliding-window draft layers are not supported ({name}'s Qwen3 "
                          "drafters use full attention)")
    for field, bad in (("hidden_act", lambda v: v not in (None, "silu")),
                       ("attention_bias", bool)):
        if bad(hf.get(field)):
            raise ConfigError(f"{field}={hf.get(field)!r} is not supported ({name} layers are "
                              "bias-free SiLU Qwen3 blocks)")
    trained_on = hf.get("num_target_layers")
    if trained_on is not None and trained_on != target.num_layers:
        raise ConfigError(f"num_target_layers={trained_on} does not match the target's "
                          f"{target.num_layers} layers: this drafter was trained for a "
                          "different target")
    heads = hf["num_attention_heads"]
    return dict(
        hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        # transformers' Qwen3Config class default, which the reference code reads when absent
        head_dim=hf.get("head_dim") or 128,
        vocab_size=hf.get("vocab_size") or target.vocab_size,
        target_hidden_size=target.hidden_size, block_size=hf["block_size"],
        # transformers' Qwen3Config class default as well
        rope_theta=rope_theta_from_hf(hf, default=10_000.0),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6))


def load_dflash(directory: str, *, target_config: Qwen3Config, dtype="float32") -> DFlash:
    """Loads a z-lab DFlash drafter (model.safetensors, single or sharded) for a Qwen3 target."""
    return load_block_drafter(directory, read_dflash_config, DFlash, lambda cfg: GLOBAL_MAP,
                              target_config=target_config, dtype=dtype)


def load_block_drafter(directory: str, read_config, model_cls, global_map, *,
                       target_config: Qwen3Config, dtype):
    """A block drafter (the DFlash body plus unstacked tensors) from a Hugging Face directory:
    read_config(directory, target_config=) -> its config cfg, global_map(cfg) -> {HF name:
    (our path, transform)} of its unstacked tensors, model_cls(cfg, ...) its module."""
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint path {directory!r} is not a directory")
    dtype = resolve_dtype(dtype)
    cfg = read_config(directory, target_config=target_config)
    with TensorReader(directory) as reader:
        plan = _plan_tensors(cfg, global_map(cfg), set(reader.keys()), directory)
        model = nnx.eval_shape(lambda: model_cls(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
        fill_variables(model, plan, reader, dtype)
    return model


def _plan_tensors(cfg: DFlashConfig, global_map, keys: set[str], directory: str):
    """our path -> HF sources (one per layer for stacked params); refuses missing and
    unexpected tensors."""
    plan = {path: [(hf, t)] for hf, (path, t) in global_map.items()}
    for suffix, (ours, t) in LAYER_MAP.items():
        plan[f"layers.{ours}"] = [(f"layers.{i}.{suffix}", t) for i in range(cfg.num_layers)]
    expected = {hf for sources in plan.values() for hf, _ in sources}
    missing = sorted(expected - keys)
    if missing:
        hint = (": its tensors carry a 'model.' prefix, which this layout does not use"
                if any(k.startswith("model.") for k in keys) else "")
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor {missing[0]!r}{more} in {directory}{hint}")
    unexpected = sorted(k for k in keys - expected if not _IGNORED.match(k))
    if unexpected:
        m = _LAYER_KEY.match(unexpected[0])
        hint = (f": config.json has num_hidden_layers={cfg.num_layers}"
                if m and int(m.group(1)) >= cfg.num_layers else "")
        raise CheckpointError(f"unexpected tensor {unexpected[0]!r} in {directory} "
                              f"({len(unexpected)} unexpected in all){hint}")
    return plan


def save_dflash_hf(model: DFlash, directory: str) -> None:
    """Writes `model` in the z-lab layout (config.json + model.safetensors) through the same
    table `load_dflash` reads."""
    cfg = model.config
    save_block_drafter(model, directory, GLOBAL_MAP, {
        "architectures": list(ARCHITECTURES),
        "dflash_config": {"mask_token_id": cfg.mask_token_id,
                          "target_layer_ids": list(cfg.target_layer_ids)}})


def save_block_drafter(model: DFlash, directory: str, global_map, fields: dict) -> None:
    """config.json (the body's Qwen3 fields, then `fields`) + model.safetensors, written
    through the tables the loader reads."""
    from safetensors.numpy import save_file

    cfg = model.config
    tensors = {hf: t.invert(np.asarray(_variable(model, path)[...]))
               for hf, (path, t) in global_map.items()}
    for suffix, (ours, t) in LAYER_MAP.items():
        stacked = np.asarray(_variable(model, f"layers.{ours}")[...])
        for i in range(cfg.num_layers):
            tensors[f"layers.{i}.{suffix}"] = t.invert(stacked[i])
    os.makedirs(directory, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(directory, SINGLE_FILE), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump({
            "model_type": "qwen3",
            "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta,
            "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
            "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
            "block_size": cfg.block_size,
            "torch_dtype": str(np.asarray(model.fc[...]).dtype),
            **fields,
        }, f, indent=2)
