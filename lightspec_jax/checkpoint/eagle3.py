"""Hugging Face Eagle3 drafters -> our Eagle3 module, in both published layouts.

* legacy (EAGLE, SGLang, SpecForge, AngelSlim): a flat LlamaConfig with architectures
  LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM / Eagle3DraftModel, the layer under
  `midlayer.`, aux layer ids in `eagle_config.eagle_aux_hidden_state_layer_ids` meaning
  "output of layer i" (SGLang adds 1; reference/checkpoint-formats.md §2.1).
* speculators (`Eagle3Speculator`): a nested `transformer_layer_config` (Llama, or Qwen3 with
  q_norm/k_norm), the layer under `layers.0.`, aux ids in `eagle_aux_hidden_state_layer_ids`
  as HF hidden_states indices, which is already our convention.

Both share one name-map table and the transforms of the Qwen3 loader (gpt-fast
`scripts/convert_hf_checkpoint.py` style); `save_eagle3_hf` writes either layout through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any, Mapping, NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lightspec_jax.models import Eagle3, Eagle3Config, Qwen3Config
from lightspec_jax.models.config import ConfigError, rope_theta_from_hf

from .qwen3 import (ATTENTION_MLP_MAP, IDENTITY, TRANSPOSE, Transform, _read, _variable,
                    resolve_dtype)
from .safetensors_io import INDEX_FILE, SINGLE_FILE, CheckpointError, TensorReader, read_json

LEGACY, SPECULATORS = "legacy", "speculators"
LEGACY_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3DraftModel")
SPECULATORS_ARCHITECTURES = ("Eagle3Speculator",)
LAYER_PREFIX = {LEGACY: "midlayer.", SPECULATORS: "layers.0."}
TORCH_FILE = "pytorch_model.bin"

# HF name -> (our path, transform). `d2t` is read apart (int64 offsets -> int32 buffer, range
# checked) and `t2d` (target -> draft mask) is unused at inference.
GLOBAL_MAP = {
    "fc.weight": ("fc", TRANSPOSE),
    "fc.bias": ("fc_bias", IDENTITY),
    "norm.weight": ("norm", IDENTITY),
    "lm_head.weight": ("lm_head", TRANSPOSE),
    "embed_tokens.weight": ("embed", IDENTITY),
}
# HF name under the layer prefix -> (our path under `layer.`, transform)
LAYER_MAP = {
    "input_layernorm.weight": ("input_layernorm", IDENTITY),
    "hidden_norm.weight": ("hidden_norm", IDENTITY),
    "post_attention_layernorm.weight": ("post_attention_layernorm", IDENTITY),
    **ATTENTION_MLP_MAP,
}
_IGNORED = re.compile(r"^(t2d|verifier_.*|.*rotary_emb\.inv_freq)$")
_EXTRA_LAYER = re.compile(r"^(layers\.[1-9]\d*|midlayer\.?[1-9]\d*)\.")
# Class defaults transformers fills in for fields an older `to_diff_dict` dropped from a nested
# speculators layer config because they equalled the default.
_LAYER_DEFAULTS = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                  num_attention_heads=32, rms_norm_eps=1e-6),
    "qwen3": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                  num_attention_heads=32, num_key_value_heads=32, head_dim=128, rms_norm_eps=1e-6),
}


class DrafterCheckpoint(NamedTuple):
    config: Eagle3Config
    layout: str  # LEGACY or SPECULATORS
    tied: bool  # legacy tie_word_embeddings with Vd == V: lm_head may be the embedding


def read_eagle3_config(directory: str, *, target_config: Qwen3Config) -> DrafterCheckpoint:
    """Parses a drafter's config.json and checks it against the target it will draft for."""
    path = os.path.join(directory, "config.json")
    try:
        return _parse_config(read_json(path), target_config)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from e


def _parse_config(hf: Mapping[str, Any], target: Qwen3Config) -> DrafterCheckpoint:
    archs = hf.get("architectures") or []
    spec_type = hf.get("speculators_model_type")
    if any(a in SPECULATORS_ARCHITECTURES for a in archs) or spec_type is not None:
        if spec_type not in (None, "eagle3"):
            raise ConfigError(f"speculators_model_type={spec_type!r} is not an Eagle3 drafter")
        layout, layer = SPECULATORS, hf.get("transformer_layer_config")
        if not isinstance(layer, Mapping):
            raise ConfigError("an Eagle3Speculator config needs a transformer_layer_config object")
    elif any(a in LEGACY_ARCHITECTURES for a in archs):
        layout, layer = LEGACY, hf
    else:
        raise ConfigError(f"unsupported architecture: architectures={archs!r}; expected one of "
                          f"{LEGACY_ARCHITECTURES + SPECULATORS_ARCHITECTURES}")
    model_type = layer.get("model_type", "llama")
    if model_type not in _LAYER_DEFAULTS:
        raise ConfigError(f"decoder layer model_type={model_type!r} is not supported; "
                          "expected 'llama' or 'qwen3'")

    def field(name):
        value = layer.get(name)
        return _LAYER_DEFAULTS[model_type].get(name) if value is None else value

    for name, bad in (("hidden_act", lambda v: v not in (None, "silu")),
                      ("attention_bias", bool), ("mlp_bias", bool)):
        if bad(layer.get(name)):
            raise ConfigError(f"{name}={layer.get(name)!r} is not supported (Eagle3 layers are "
                              "bias-free SiLU Llama blocks)")
    for name in ("fc_norm", "norm_before_fc"):
        if hf.get(name):
            raise ConfigError(f"{name}=true is not supported")
    num_layers = layer.get("num_hidden_layers")
    if num_layers not in (None, 1):
        raise ConfigError(f"num_hidden_layers={num_layers}: only single-layer Eagle3 drafters "
                          "are supported")

    hidden, vocab = field("hidden_size"), field("vocab_size")
    target_hidden = hf.get("target_hidden_size") or hidden
    for name, value, ours, want in (
            ("hidden_size", hidden, "hidden_size", target.hidden_size),
            ("target_hidden_size", target_hidden, "hidden_size", target.hidden_size),
            ("vocab_size", vocab, "vocab_size", target.vocab_size)):
        if value != want:
            raise ConfigError(f"{name}={value} does not match the target's {ours}={want}: this "
                              "drafter was trained for a different target")
    draft_vocab = hf.get("draft_vocab_size") or vocab
    # Only the legacy flag counts: a speculators layer config is often the verifier's own
    # (tied for Qwen3-0.6B/1.7B/4B), yet that format always stores a separate [Vd, H] lm_head.
    tied = layout == LEGACY and bool(hf.get("tie_word_embeddings"))
    if tied and draft_vocab != vocab:
        raise ConfigError(
            f"tie_word_embeddings=true with draft_vocab_size={draft_vocab} != vocab_size={vocab}: "
            "an lm_head over the draft vocab cannot be the [V, H] embedding; fix the flag if the "
            "checkpoint stores its own lm_head.weight")

    heads = field("num_attention_heads")
    return DrafterCheckpoint(Eagle3Config(
        hidden_size=hidden, intermediate_size=field("intermediate_size"), num_heads=heads,
        num_kv_heads=field("num_key_value_heads") or heads,
        # A Llama config without head_dim means hidden/heads (LlamaConfig's rule); Qwen3's
        # class default is 128.
        head_dim=field("head_dim") or hidden // heads,
        rope_theta=rope_theta_from_hf(layer, default=10_000.0),
        rms_norm_eps=field("rms_norm_eps"), vocab_size=vocab, draft_vocab_size=draft_vocab,
        target_hidden_size=target_hidden,
        aux_layer_ids=_aux_layer_ids(hf, layout, target),
        qk_norm=model_type == "qwen3",
        # speculators' own class defaults this to false (vLLM's converter assumes true when
        # absent, but speculators always writes the key).
        norm_before_residual=bool(hf.get("norm_before_residual", False)),
        norm_output=bool(hf.get("norm_output", False)),
        fc_bias=bool(hf.get("bias", False)),
    ), layout, tied)


def _aux_layer_ids(hf: Mapping[str, Any], layout: str, target: Qwen3Config) -> tuple[int, ...]:
    """Our convention: j = the residual stream entering target layer j (HF hidden_states[j])."""
    if layout == LEGACY:
        raw = (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        shift, key = 1, "eagle_config.eagle_aux_hidden_state_layer_ids (output of layer i)"
    else:
        raw = hf.get("eagle_aux_hidden_state_layer_ids")
        shift, key = 0, "eagle_aux_hidden_state_layer_ids (HF hidden_states index)"
    if raw is None:
        return target.default_aux_layers
    ids = [int(i) + shift for i in raw]
    n = target.num_layers
    for i, j in zip(raw, ids):
        if not 0 <= j < n:
            raise ConfigError(f"{key} lists {i}, which is the input of target layer {j}: outside "
                              f"[0, {n}) for the {n}-layer target")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{key}={list(raw)} repeats a layer")
    # Engines collect aux states in layer order whatever the list order, so features are
    # concatenated ascending.
    return tuple(sorted(ids))


def load_eagle3(directory: str, *, target_config: Qwen3Config, dtype="float32",
                load_embed: bool = True) -> Eagle3:
    """Loads an HF Eagle3 drafter (either layout) for a Qwen3 target.

    Weights come from model.safetensors (single or sharded) or, when torch is importable, from
    pytorch_model.bin. load_embed=False skips a stored `embed_tokens.weight` (a frozen copy of
    the target's, V*H values) and the engine passes the target's embedding instead.
    """
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint path {directory!r} is not a directory")
    dtype = resolve_dtype(dtype)
    info = read_eagle3_config(directory, target_config=target_config)
    cfg = info.config
    with _open_weights(directory) as reader:
        keys = set(reader.keys())
        with_embed = load_embed and "embed_tokens.weight" in keys
        plan = _plan_tensors(info, keys, with_embed=with_embed, directory=directory)
        _check_fc(reader, cfg)
        model = nnx.eval_shape(lambda: Eagle3(cfg, dtype=dtype, with_embed=with_embed,
                                              rngs=nnx.Rngs(0)))
        for path, (hf_name, transform) in plan.items():
            var = _variable(model, path)
            value = _read(reader, hf_name, transform, tuple(var.get_value().shape))
            var.set_value(jnp.asarray(value.astype(np.dtype(dtype))))
        model.d2t.set_value(jnp.asarray(_read_d2t(reader, cfg, keys)))
    return model


def _plan_tensors(info: DrafterCheckpoint, keys: set[str], *, with_embed: bool,
                  directory: str) -> dict[str, tuple[str, Transform]]:
    """our path -> (HF name, transform); refuses missing, unexpected and extra-layer tensors."""
    cfg, prefix = info.config, LAYER_PREFIX[info.layout]
    plan = {path: (hf, t) for hf, (path, t) in GLOBAL_MAP.items()
            if (path != "fc_bias" or cfg.fc_bias) and (path != "embed" or with_embed)}
    if info.tied and "lm_head.weight" not in keys:
        plan["lm_head"] = ("embed_tokens.weight", TRANSPOSE)  # [V, H] -> [H, V]
    for suffix, (ours, t) in LAYER_MAP.items():
        if cfg.qk_norm or ours not in ("q_norm", "k_norm"):
            plan[f"layer.{ours}"] = (prefix + suffix, t)

    extra_layers = sorted(k for k in keys if _EXTRA_LAYER.match(k))
    if extra_layers:
        raise CheckpointError(f"{directory} holds more than one decoder layer (e.g. "
                              f"{extra_layers[0]!r}): multi-layer Eagle3 drafters are unsupported")
    expected = {hf for hf, _ in plan.values()}
    missing = sorted(expected - keys)
    if missing:
        other = LAYER_PREFIX[SPECULATORS if info.layout == LEGACY else LEGACY]
        hint = (f"; its tensors use the '{other}' prefix of the other layout, but config.json "
                f"describes a {info.layout} drafter" if any(k.startswith(other) for k in keys)
                else "")
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor {missing[0]!r}{more} in {directory}{hint}")
    optional = {"d2t", "embed_tokens.weight", "lm_head.weight"}
    unexpected = sorted(k for k in keys - expected - optional if not _IGNORED.match(k))
    if unexpected:
        hints = {"fc.bias": ": config.json does not set bias=true",
                 f"{prefix}self_attn.q_norm.weight": ": q_norm/k_norm need a qwen3 layer config"}
        hint = hints.get(unexpected[0], "")
        raise CheckpointError(f"unexpected tensor {unexpected[0]!r} in {directory} "
                              f"({len(unexpected)} unexpected in all){hint}")
    return plan


def _check_fc(reader, cfg: Eagle3Config) -> None:
    """fc's input width says how many aux layers the drafter was trained on."""
    shape = reader.shape("fc.weight")
    if len(shape) == 2 and shape[0] == cfg.hidden_size and shape[1] != cfg.feature_size:
        trained = (f" (the checkpoint was trained on {shape[1] // cfg.target_hidden_size} layers)"
                   if shape[1] % cfg.target_hidden_size == 0 else "")
        raise CheckpointError(
            f"fc.weight in {reader.directory} takes {shape[1]} input features, but the "
            f"{cfg.num_aux} aux layers {list(cfg.aux_layer_ids)} x target hidden size "
            f"{cfg.target_hidden_size} give {cfg.feature_size}{trained}")


def _read_d2t(reader, cfg: Eagle3Config, keys: set[str]) -> np.ndarray:
    """d2t [Vd] int32 offsets (target = draft id + d2t[id]); zeros when there is no mapping."""
    vd, v = cfg.draft_vocab_size, cfg.vocab_size
    if "d2t" not in keys:
        if vd < v:
            raise CheckpointError(
                f"missing tensor 'd2t' in {reader.directory}: draft_vocab_size={vd} < "
                f"vocab_size={v} needs the draft -> target id map")
        return np.zeros(vd, np.int32)
    if reader.shape("d2t") != (vd,):
        raise CheckpointError(f"tensor 'd2t' in {reader.directory} has shape "
                              f"{list(reader.shape('d2t'))}, expected [{vd}] (draft_vocab_size)")
    d2t = reader.get("d2t")
    if not np.issubdtype(d2t.dtype, np.integer):
        raise CheckpointError(f"tensor 'd2t' in {reader.directory} has dtype {d2t.dtype}; "
                              "expected integer offsets (I64)")
    target = np.arange(vd, dtype=np.int64) + d2t.astype(np.int64)
    bad = np.flatnonzero((target < 0) | (target >= v))
    if bad.size:
        i = int(bad[0])
        raise CheckpointError(
            f"d2t in {reader.directory} maps draft id {i} to target id {int(target[i])}, outside "
            f"[0, {v}) ({bad.size} such ids): the map belongs to another vocabulary")
    return d2t.astype(np.int32)


def _open_weights(directory: str):
    if os.path.isfile(os.path.join(directory, INDEX_FILE)) or \
            os.path.isfile(os.path.join(directory, SINGLE_FILE)):
        return TensorReader(directory)
    if os.path.isfile(os.path.join(directory, TORCH_FILE)):
        return _TorchFileReader(directory)
    raise CheckpointError(f"no weights in {directory}: expected {SINGLE_FILE}, {INDEX_FILE} or "
                          f"{TORCH_FILE}")


class _TorchFileReader(contextlib.AbstractContextManager):
    """The TensorReader interface over a `pytorch_model.bin` (EAGLE and AngelSlim ship these)."""

    def __init__(self, directory: str):
        path = os.path.join(directory, TORCH_FILE)
        try:
            import torch
        except ImportError:
            raise CheckpointError(f"{path} is a PyTorch file and torch is not installed; install "
                                  "torch or convert the checkpoint to safetensors") from None
        self.directory = directory
        try:
            self._tensors = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises several types for corrupt or unsafe pickles
            raise CheckpointError(f"cannot read {path}: {e}") from e
        self._torch = torch

    def keys(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def get(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        # numpy has no bfloat16: widen (exactly) to float32; the caller casts to the model dtype.
        return (t.float() if t.dtype == self._torch.bfloat16 else t).numpy()

    def __exit__(self, *exc):
        self._tensors = {}
        return False


def save_eagle3_hf(model: Eagle3, directory: str, *, layout: str = LEGACY) -> None:
    """Writes `model` as an HF Eagle3 directory: config.json + model.safetensors (I64 d2t,
    BOOL t2d), through the same table `load_eagle3` reads."""
    from safetensors.numpy import save_file

    cfg = model.config
    if layout not in LAYER_PREFIX:
        raise ValueError(f"layout must be {LEGACY!r} or {SPECULATORS!r}, got {layout!r}")
    if layout == LEGACY and cfg.qk_norm:
        raise ValueError("the legacy (Llama) layout has no q_norm/k_norm; use layout='speculators'")
    if layout == SPECULATORS and cfg.fc_bias:
        raise ValueError("the speculators layout has no fc bias; use layout='legacy'")
    tensors: dict[str, np.ndarray] = {}
    for hf_name, (path, transform) in GLOBAL_MAP.items():
        if getattr(model, path) is not None:
            tensors[hf_name] = transform.invert(np.asarray(_variable(model, path)[...]))
    for suffix, (ours, transform) in LAYER_MAP.items():
        var = getattr(model.layer, ours)
        if var is not None:
            tensors[LAYER_PREFIX[layout] + suffix] = transform.invert(np.asarray(var[...]))
    d2t = np.asarray(model.d2t[...]).astype(np.int64)
    t2d = np.zeros(cfg.vocab_size, np.bool_)
    t2d[np.arange(cfg.draft_vocab_size) + d2t] = True
    tensors.update(d2t=d2t, t2d=t2d)
    dtype = str(np.asarray(model.fc[...]).dtype)
    os.makedirs(directory, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(directory, SINGLE_FILE), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(_config_to_hf(cfg, layout, dtype), f, indent=2)


def _config_to_hf(cfg: Eagle3Config, layout: str, dtype: str) -> dict[str, Any]:
    layer = {
        "model_type": "qwen3" if cfg.qk_norm else "llama",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": 1, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps, "vocab_size": cfg.vocab_size,
        # both RoPE spellings, as the Qwen3 writer does (transformers v4 and v5 readers)
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False, "torch_dtype": dtype,
    }
    flags = {"norm_before_residual": cfg.norm_before_residual, "norm_output": cfg.norm_output}
    if layout == LEGACY:
        return {
            "architectures": ["LlamaForCausalLMEagle3"], **layer,
            "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_hidden_size,
            "bias": cfg.fc_bias,
            # SGLang convention: "output of layer i" = our j - 1
            "eagle_config": {"eagle_aux_hidden_state_layer_ids":
                             [j - 1 for j in cfg.aux_layer_ids]},
            **{k: v for k, v in flags.items() if v},
        }
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "transformer_layer_config": layer, "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids), **flags,
        "speculators_config": {"algorithm": "eagle3", "verifier": {
            "architectures": ["Qwen3ForCausalLM"]}},
        "torch_dtype": dtype,
    }
