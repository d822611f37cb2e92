"""Converted checkpoints: our parameter tree saved with orbax, beside the HF config it came from.

Layout of a converted directory:
  lightspec.json   {"format": FORMAT, "version": 1, "model": "qwen3", "dtype": ...}
  config.json      the Hugging Face config (so the same config reader and tokenizer tools apply)
  tokenizer files  copied from the source when present
  params/          orbax-checkpoint of the NNX parameter state as a plain nested dict
"""

from __future__ import annotations

import json
import os
import shutil

import jax
from flax import nnx

from .safetensors_io import CheckpointError, read_json

FORMAT = "lightspec-jax-converted"
MARKER = "lightspec.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "vocab.json", "merges.txt")


def is_converted(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, MARKER))


def save_converted(model: nnx.Module, directory: str, *, model_kind: str, hf_config: dict,
                   source_dir: str | None = None) -> None:
    """Writes `model`'s parameters with orbax plus the metadata needed to rebuild it."""
    import orbax.checkpoint as ocp

    directory = os.path.abspath(directory)
    params_dir = os.path.join(directory, "params")
    if os.path.exists(params_dir):
        raise CheckpointError(f"{params_dir} already exists; refusing to overwrite a conversion")
    os.makedirs(directory, exist_ok=True)
    state = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    dtype = str(jax.tree.leaves(state)[0].dtype)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(params_dir, state)
    checkpointer.wait_until_finished()
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    with open(os.path.join(directory, MARKER), "w") as f:
        json.dump({"format": FORMAT, "version": 1, "model": model_kind, "dtype": dtype}, f, indent=2)
    if source_dir:
        for name in TOKENIZER_FILES:
            src = os.path.join(source_dir, name)
            if os.path.isfile(src):
                shutil.copy(src, os.path.join(directory, name))


def read_marker(directory: str) -> dict:
    marker = read_json(os.path.join(directory, MARKER))
    if marker.get("format") != FORMAT or marker.get("version") != 1:
        raise CheckpointError(
            f"{os.path.join(directory, MARKER)} is not a version-1 {FORMAT} marker: {marker!r}")
    return marker


def restore_params(abstract_model: nnx.Module, directory: str,
                   placed: list[jax.ShapeDtypeStruct] | None = None) -> nnx.Module:
    """Fills an abstract (eval_shape) module with the arrays saved under `directory`/params.

    placed: one ShapeDtypeStruct per parameter (`jax.tree.leaves` order of its nnx.Param
    state) carrying the sharding to restore it in (engine/sharding.py MeshLayout.
    abstract_target): orbax then reads for each device only the slice it holds, so the host
    never holds the whole model. None: each array whole on the default device."""
    import orbax.checkpoint as ocp

    params_dir = os.path.join(os.path.abspath(directory), "params")
    if not os.path.isdir(params_dir):
        raise CheckpointError(f"missing {params_dir}: not a complete converted checkpoint")
    state = nnx.state(abstract_model, nnx.Param)
    if placed is not None:
        state = jax.tree.unflatten(jax.tree.structure(state), placed)
    target = nnx.to_pure_dict(state)
    try:
        restored = ocp.StandardCheckpointer().restore(params_dir, target)
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise CheckpointError(f"cannot restore {params_dir} into the model built from "
                              f"config.json: {e}") from e
    nnx.replace_by_pure_dict(state, restored)
    nnx.update(abstract_model, state)
    return abstract_model
