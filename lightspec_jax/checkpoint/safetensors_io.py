"""Reading Hugging Face safetensors checkpoints tensor by tensor.

A directory holds either one `model.safetensors` or shards listed by
`model.safetensors.index.json` ({"weight_map": {name: file}}); we always route through the
weight map. Tensors are read one at a time (memory-mapped by safetensors), so peak host memory is
the converted model plus one tensor, never twice the checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Iterator

import numpy as np
from safetensors import SafetensorError, safe_open

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file or tensor at fault."""


def read_json(path: str) -> dict:
    if not os.path.isfile(path):
        raise CheckpointError(f"missing file {path}")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e


class TensorReader(contextlib.AbstractContextManager):
    """name -> numpy array over a checkpoint directory (single file or sharded with an index)."""

    def __init__(self, directory: str):
        self.directory = directory
        index_path = os.path.join(directory, INDEX_FILE)
        single_path = os.path.join(directory, SINGLE_FILE)
        if os.path.isfile(index_path):
            weight_map = read_json(index_path).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index_path} has no 'weight_map' of tensor name -> file")
            self.weight_map: dict[str, str] = dict(weight_map)
        elif os.path.isfile(single_path):
            self.weight_map = {name: SINGLE_FILE for name in self._open(SINGLE_FILE).keys()}
        else:
            raise CheckpointError(
                f"no weights in {directory}: expected {SINGLE_FILE} or {INDEX_FILE}")
        self._handles: dict[str, object] = {}

    def _open(self, filename: str):
        path = os.path.join(self.directory, filename)
        if not os.path.isfile(path):
            raise CheckpointError(f"missing shard {path} (listed in the checkpoint's weight map)")
        try:
            return safe_open(path, framework="numpy")
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"cannot read {path}: {e} (truncated or corrupt file?)") from e

    def _handle(self, filename: str):
        if filename not in self._handles:
            self._handles[filename] = self._open(filename)
        return self._handles[filename]

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def shape(self, name: str) -> tuple[int, ...]:
        handle = self._handle(self._file_of(name))
        return tuple(handle.get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        return self._read(name, lambda handle: handle.get_tensor(name))

    def get_slice(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """tensor[index], reading only that block from the file (safetensors slice reads)."""
        return self._read(name, lambda handle: handle.get_slice(name)[index])

    def _read(self, name: str, take) -> np.ndarray:
        filename = self._file_of(name)
        try:
            return take(self._handle(filename))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(
                f"cannot read tensor {name!r} from {os.path.join(self.directory, filename)}: {e}"
            ) from e

    def _file_of(self, name: str) -> str:
        try:
            return self.weight_map[name]
        except KeyError:
            raise CheckpointError(f"missing tensor {name!r} in {self.directory}") from None

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in self.weight_map:
            yield name, self.get(name)

    def close(self):
        self._handles.clear()

    def __exit__(self, *exc):
        self.close()
        return False
