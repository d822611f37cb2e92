"""Hugging Face Qwen3 checkpoint -> our Qwen3 NNX module, as a name-map table plus transforms.

The table maps each HF tensor name to a parameter path of `models.qwen3.Qwen3` and a named
transform from torch layout ([out, in] Linear weights, heads as the slow axis of a feature) to
ours (the convention of gpt-fast `scripts/convert_hf_checkpoint.py`: a table, a few transforms).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lightspec_jax.models import Qwen3, Qwen3Config
from lightspec_jax.models.config import ConfigError

from .safetensors_io import CheckpointError, TensorReader, read_json

log = logging.getLogger(__name__)


Index = tuple[slice, ...]  # one slice per axis, with int start and stop, step 1


@dataclasses.dataclass(frozen=True)
class Transform:
    """HF tensor <-> our layout; `hf_shape` says what shape the HF tensor must have.

    `window` maps a block of ours to the HF block holding it, for reading one device's shard:
    window(index, ours_shape) -> (HF index, block shape, inner index), such that
    apply(hf[HF index], block shape)[inner index] == ours[index]."""

    name: str
    hf_shape: Callable[[tuple[int, ...]], tuple[int, ...]]
    apply: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]  # HF -> ours (target shape)
    invert: Callable[[np.ndarray], np.ndarray]  # ours -> HF
    window: Callable[[Index, tuple[int, ...]], tuple[Index, tuple[int, ...], Index]]


def _sizes(index: Index) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in index)


def _heads_rows(heads: slice, head_dim: int) -> slice:
    """HF feature rows of query/KV heads [a, b): heads are the slow axis (head * D + d)."""
    return slice(heads.start * head_dim, heads.stop * head_dim)


_ALL = slice(None)


def _whole_window(index: Index, shape):
    return index, _sizes(index), (_ALL,) * len(index)


def _to_heads_window(index: Index, shape):
    """ours [H, heads, D] <- HF [heads*D, H]: a block of heads [a, b) is HF rows
    [a*D, b*D), read whole in D and cut after."""
    h, heads, d = index
    return (_heads_rows(heads, shape[2]), h), (*_sizes((h, heads)), shape[2]), (_ALL, _ALL, d)


def _from_heads_window(index: Index, shape):
    """ours [heads, D, H] <- HF [H, heads*D]."""
    heads, d, h = index
    block = (*_sizes((heads,)), shape[1], *_sizes((h,)))
    return (h, _heads_rows(heads, shape[1])), block, (_ALL, d, _ALL)


IDENTITY = Transform("identity", lambda s: s, lambda w, s: w, lambda w: w, _whole_window)
# torch Linear [out, in] -> kernel [in, out]
TRANSPOSE = Transform("transpose", lambda s: s[::-1], lambda w, s: w.T, lambda w: w.T,
                      lambda ix, s: (ix[::-1], _sizes(ix), (_ALL,) * len(ix)))
# q/k/v: [heads*D, H] -> [H, heads, D] (feature = head*D + d, heads the slow axis)
TO_HEADS = Transform("to_heads", lambda s: (s[1] * s[2], s[0]), lambda w, s: w.T.reshape(s),
                     lambda w: w.reshape(w.shape[0], -1).T, _to_heads_window)
# o_proj: [H, heads*D] -> [heads, D, H]
FROM_HEADS = Transform("from_heads", lambda s: (s[2], s[0] * s[1]), lambda w, s: w.T.reshape(s),
                       lambda w: w.reshape(-1, w.shape[-1]).T, _from_heads_window)

# HF name (global) -> (our path, transform)
GLOBAL_MAP = {
    "model.embed_tokens.weight": ("embed", IDENTITY),
    "model.norm.weight": ("norm", IDENTITY),
    "lm_head.weight": ("lm_head", TRANSPOSE),
}
# Attention and MLP of a Llama/Qwen3-style decoder layer: HF suffix -> (our name, transform).
# Shared by the Qwen3 target and the Eagle3 drafter, whose layers differ only in their norms.
ATTENTION_MLP_MAP = {
    "self_attn.q_proj.weight": ("q_proj", TO_HEADS),
    "self_attn.k_proj.weight": ("k_proj", TO_HEADS),
    "self_attn.v_proj.weight": ("v_proj", TO_HEADS),
    "self_attn.o_proj.weight": ("o_proj", FROM_HEADS),
    "self_attn.q_norm.weight": ("q_norm", IDENTITY),
    "self_attn.k_norm.weight": ("k_norm", IDENTITY),
    "mlp.gate_proj.weight": ("gate_proj", TRANSPOSE),
    "mlp.up_proj.weight": ("up_proj", TRANSPOSE),
    "mlp.down_proj.weight": ("down_proj", TRANSPOSE),
}
# HF name under model.layers.{i}. -> (our stacked path under layers., transform)
LAYER_MAP = {
    "input_layernorm.weight": ("input_norm", IDENTITY),
    "post_attention_layernorm.weight": ("post_norm", IDENTITY),
    **ATTENTION_MLP_MAP,
}
_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)")
# Buffers some exporters store that carry no parameters.
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def read_qwen3_config(directory: str) -> Qwen3Config:
    hf = read_json(os.path.join(directory, "config.json"))
    try:
        return Qwen3Config.from_hf(hf)
    except ConfigError as e:
        raise CheckpointError(f"{os.path.join(directory, 'config.json')}: {e}") from e


def resolve_dtype(dtype) -> jnp.dtype:
    try:
        return jnp.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32' or 'bfloat16'") from e


def abstract_qwen3(cfg: Qwen3Config, dtype) -> Qwen3:
    """The module with ShapeDtypeStruct leaves: shapes without allocating weights."""
    return nnx.eval_shape(lambda: Qwen3(cfg, dtype=dtype, rngs=nnx.Rngs(0)))


def load_qwen3_hf(directory: str, *, dtype="float32") -> Qwen3:
    """Loads a Qwen3 HF directory (config.json + safetensors, single or sharded) into Qwen3.

    Stacked layer parameters are filled in a preallocated host buffer one HF tensor at a time and
    moved to the device one parameter at a time, so peak host memory stays near one model copy.
    """
    dtype = resolve_dtype(dtype)
    cfg = read_qwen3_config(directory)
    model = abstract_qwen3(cfg, dtype)
    with TensorReader(directory) as reader:
        fill_variables(model, _plan_tensors(cfg, reader), reader, dtype)
    return model


def load_qwen3_sharded(directory: str, layout, *, dtype="float32"
                       ) -> tuple[Qwen3, list[jax.Array], jax.Array]:
    """Loads a Qwen3 HF directory straight into a mesh's shardings (engine/sharding.py
    MeshLayout): each shard is read from the safetensors files as a slice of its HF tensors
    (`safe_open(...).get_slice`), never the whole tensor, and put on the devices that hold it,
    so the host holds about one shard at a time and a process reads only what its devices hold.

    Returns (the module with abstract leaves: config and structure, no weights; the placed
    leaves and the embedding [V, H], equal to `layout.place_target` of the plainly loaded model).
    """
    from lightspec_jax.engine.sharding import leaf_paths

    dtype = resolve_dtype(dtype)
    np_dtype = np.dtype(dtype)
    cfg = read_qwen3_config(directory)
    model = abstract_qwen3(cfg, dtype)
    state = nnx.state(model)
    shapes = dict(zip(leaf_paths(state), (tuple(x.shape) for x in jax.tree.leaves(state))))
    with TensorReader(directory) as reader:
        plan = _plan_tensors(cfg, reader)

        def read(path: str, index: Index) -> np.ndarray:  # a block of our (unrepeated) leaf
            shape, sources = shapes[path], plan[path]
            if not path.startswith("layers."):
                (hf_name, transform), = sources
                return _read_block(reader, hf_name, transform, shape, index).astype(np_dtype)
            block = np.empty(_sizes(index), np_dtype)  # [l, ...]: the layers of this shard
            for i, layer in enumerate(range(index[0].start, index[0].stop)):
                hf_name, transform = sources[layer]
                block[i] = _read_block(reader, hf_name, transform, shape[1:], index[1:])
            return block

        leaves, embed = layout.assemble_target(state, read)
    return model, leaves, embed


def fill_variables(model, plan: dict[str, list[tuple[str, Transform]]], reader: TensorReader,
                   dtype) -> None:
    """Sets each of `model`'s variables from its HF sources (plan: our path -> sources; a
    stacked `layers.` variable [L, ...] has one source per layer, read one at a time so the
    host holds one stacked tensor at most)."""
    np_dtype = np.dtype(dtype)
    for path, sources in plan.items():
        var = _variable(model, path)
        shape = tuple(var.get_value().shape)
        if path.startswith("layers."):
            buf = np.empty(shape, np_dtype)
            for layer, (hf_name, transform) in enumerate(sources):
                buf[layer] = _read(reader, hf_name, transform, shape[1:]).astype(np_dtype)
        else:
            (hf_name, transform), = sources
            buf = _read(reader, hf_name, transform, shape).astype(np_dtype)
        var.set_value(jnp.asarray(buf))
        del buf


def _plan_tensors(cfg: Qwen3Config, reader: TensorReader) -> dict[str, list[tuple[str, Transform]]]:
    """our path -> HF sources (one per layer for stacked params); checks the key set."""
    plan: dict[str, list[tuple[str, Transform]]] = {}
    for hf_name, (path, transform) in GLOBAL_MAP.items():
        plan[path] = [(hf_name, transform)]
    if cfg.tie_word_embeddings:
        del plan["lm_head"]
    for ours, _ in LAYER_MAP.values():
        plan[f"layers.{ours}"] = []
    for layer in range(cfg.num_layers):
        for suffix, (ours, transform) in LAYER_MAP.items():
            plan[f"layers.{ours}"].append((f"model.layers.{layer}.{suffix}", transform))

    expected = {hf for sources in plan.values() for hf, _ in sources}
    present = set(reader.keys())
    if not cfg.tie_word_embeddings and "lm_head.weight" not in present:
        raise CheckpointError(
            f"missing tensor 'lm_head.weight' in {reader.directory}: config.json says "
            "tie_word_embeddings=false, so an untied checkpoint must store its lm_head")
    missing = sorted(expected - present)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor {missing[0]!r}{more} in {reader.directory}")
    unexpected = sorted(k for k in present - expected
                        if not _IGNORED.match(k) and k != "lm_head.weight")
    if unexpected:
        m = _LAYER_KEY.match(unexpected[0])
        hint = (f": config.json has num_hidden_layers={cfg.num_layers}"
                if m and int(m.group(1)) >= cfg.num_layers else "")
        raise CheckpointError(
            f"unexpected tensor {unexpected[0]!r} in {reader.directory} "
            f"({len(unexpected)} unexpected in all){hint}")
    return plan


def _check_shape(reader: TensorReader, hf_name: str, transform: Transform,
                 target_shape: tuple[int, ...]) -> None:
    want = tuple(transform.hf_shape(target_shape))
    got = reader.shape(hf_name)
    if got != want:
        raise CheckpointError(
            f"tensor {hf_name!r} in {reader.directory} has shape {list(got)}, expected "
            f"{list(want)} from config.json")


def _read(reader: TensorReader, hf_name: str, transform: Transform,
          target_shape: tuple[int, ...]) -> np.ndarray:
    _check_shape(reader, hf_name, transform, target_shape)
    return transform.apply(reader.get(hf_name), target_shape)


def _read_block(reader: TensorReader, hf_name: str, transform: Transform,
                target_shape: tuple[int, ...], index: Index) -> np.ndarray:
    """ours[index] of one HF tensor, reading only the HF block that holds it."""
    _check_shape(reader, hf_name, transform, target_shape)
    hf_index, block_shape, inner = transform.window(index, target_shape)
    return transform.apply(reader.get_slice(hf_name, hf_index), block_shape)[inner]


def _variable(model: nnx.Module, path: str) -> nnx.Variable:
    obj = model
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def param_count(model: nnx.Module) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def save_qwen3_hf(model: Qwen3, directory: str, *, max_shard_bytes: int | None = None) -> None:
    """Writes `model` as a Hugging Face Qwen3 directory (config.json + safetensors).

    The inverse of `load_qwen3_hf` through the same table; transformers reads the result.
    With max_shard_bytes, tensors are split over `model-0000K-of-0000N.safetensors` files
    listed in `model.safetensors.index.json`.
    """
    import json

    from safetensors.numpy import save_file

    cfg = model.config
    tensors: dict[str, np.ndarray] = {}
    for hf_name, (path, transform) in GLOBAL_MAP.items():
        if path == "lm_head" and model.lm_head is None:
            continue
        tensors[hf_name] = transform.invert(np.asarray(_variable(model, path)[...]))
    for suffix, (ours, transform) in LAYER_MAP.items():
        stacked = np.asarray(_variable(model, f"layers.{ours}")[...])
        for layer in range(cfg.num_layers):
            tensors[f"model.layers.{layer}.{suffix}"] = transform.invert(stacked[layer])
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump({**cfg.to_hf(), "torch_dtype": str(next(iter(tensors.values())).dtype),
                   "dtype": str(next(iter(tensors.values())).dtype)}, f, indent=2)
    metadata = {"format": "pt"}
    if max_shard_bytes is None:
        save_file(tensors, os.path.join(directory, "model.safetensors"), metadata=metadata)
        return
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, value in tensors.items():
        if shards[-1] and size + value.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = value
        size += value.nbytes
    weight_map = {}
    for k, shard in enumerate(shards, 1):
        filename = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(directory, filename), metadata=metadata)
        weight_map.update({name: filename for name in shard})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(v.nbytes for v in tensors.values())},
                   "weight_map": weight_map}, f, indent=2)
