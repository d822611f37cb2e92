"""Device side of the plain (prefill + decode) step: pure jitted functions over split NNX state.

The model is split once into a graph definition and a flat list of parameter leaves; each step
merges them inside the jitted function (the cheapest NNX call path, see
reference/jax-platform-notes.md). The KV cache and the per-slot last tokens are donated.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from lightspec_jax.models import KVCache, Qwen3

from .buckets import BucketRegistry
from .request import Request
from .scheduler import ScheduledStep
from .sampling import sample


class StepInputs(NamedTuple):
    """Host-built inputs of one plain step (numpy; T rows padded to a bucket, N slots)."""

    row_slot: np.ndarray  # [T] int32, padding rows = N (their cache writes are dropped)
    row_pos: np.ndarray  # [T] int32
    row_token: np.ndarray  # [T] int32, ignored where row_from_device
    row_from_device: np.ndarray  # [T] bool: decode rows take the slot's last sampled token
    sample_row: np.ndarray  # [N] int32: row whose logits give the slot's next token, -1 none
    temperature: np.ndarray  # [N] f32
    top_k: np.ndarray  # [N] int32
    top_p: np.ndarray  # [N] f32
    seed: np.ndarray  # [N] uint32
    sample_pos: np.ndarray  # [N] int32: sequence position of the token being sampled


@dataclasses.dataclass
class DeviceState:
    cache: KVCache  # [L, N, S, G, D] each
    last_token: jax.Array  # [N] int32: newest sampled token per slot (its KV not yet cached)


def forward_and_sample(model: Qwen3, cache: KVCache, last_token: jax.Array, inputs: StepInputs,
                       aux_layers: tuple[int, ...] = ()):
    """Target forward over host-built rows, then one sampled token per slot.

    Returns (forward output, tokens [T] the rows carried, sampled tokens [N], new last_token [N]).
    """
    num_slots = last_token.shape[0]
    device_tokens = last_token[jnp.clip(inputs.row_slot, 0, num_slots - 1)]
    tokens = jnp.where(inputs.row_from_device, device_tokens, inputs.row_token)  # [T]
    out = model(tokens, inputs.row_pos, inputs.row_slot, cache,
                logits_rows=jnp.maximum(inputs.sample_row, 0), aux_layers=aux_layers)  # [N, V]
    new_tokens = sample(out.logits, inputs.temperature, inputs.top_k, inputs.top_p, inputs.seed,
                        inputs.sample_pos)  # [N]
    last_token = jnp.where(inputs.sample_row >= 0, new_tokens, last_token)
    return out, tokens, new_tokens, last_token


def _plain_step(graphdef, param_leaves, treedef, cache: KVCache, last_token: jax.Array,
                inputs: StepInputs):
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, param_leaves))
    out, _, new_tokens, last_token = forward_and_sample(model, cache, last_token, inputs)
    return out.cache, last_token, new_tokens


def empty_step_inputs(rows: int, n: int) -> StepInputs:
    return StepInputs(
        row_slot=np.full((rows,), n, np.int32), row_pos=np.zeros((rows,), np.int32),
        row_token=np.zeros((rows,), np.int32), row_from_device=np.zeros((rows,), bool),
        sample_row=np.full((n,), -1, np.int32), temperature=np.zeros((n,), np.float32),
        top_k=np.zeros((n,), np.int32), top_p=np.ones((n,), np.float32),
        seed=np.zeros((n,), np.uint32), sample_pos=np.zeros((n,), np.int32))


def build_step_inputs(batch: ScheduledStep, rows: int, num_slots: int) -> StepInputs:
    """Flat rows for a scheduled step: decode rows first, then prefill chunks; one sampled
    token per decoding slot and per slot whose prompt completes."""
    inputs = empty_step_inputs(rows, num_slots)
    sampling: list[tuple[Request, int]] = []  # (request, row its next token is sampled from)
    row = 0
    for request in batch.decodes:
        inputs.row_slot[row] = request.slot
        inputs.row_pos[row] = request.total_len - 1
        inputs.row_from_device[row] = True
        sampling.append((request, row))
        row += 1
    for chunk in batch.prefills:
        end = row + chunk.length
        inputs.row_slot[row:end] = chunk.request.slot
        inputs.row_pos[row:end] = np.arange(chunk.start, chunk.start + chunk.length)
        inputs.row_token[row:end] = chunk.request.prompt_token_ids[chunk.start:chunk.start + chunk.length]
        if chunk.completes_prompt:
            sampling.append((chunk.request, end - 1))
        row = end
    for request, sample_row in sampling:
        inputs.sample_row[request.slot] = sample_row
        inputs.sample_pos[request.slot] = request.total_len
        set_sampling(inputs, request)
    return inputs


def set_sampling(inputs, request: Request) -> None:
    """Writes a request's sampling parameters into its slot of per-slot input arrays."""
    slot, p = request.slot, request.params
    inputs.temperature[slot] = p.temperature
    inputs.top_k[slot] = p.top_k
    inputs.top_p[slot] = p.top_p
    inputs.seed[slot] = request.seed


def abstract(tree):
    """ShapeDtypeStructs of a pytree of arrays (what `.lower()` compiles against)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


class PlainRunner:
    """Owns the device state and the compiled plain steps, one per row bucket."""

    def __init__(self, model: Qwen3, *, num_slots: int, cache_len: int, buckets: tuple[int, ...],
                 show_progress: bool = True):
        self.model = model
        self.num_slots = num_slots
        graphdef, state = nnx.split(model)
        leaves, treedef = jax.tree.flatten(state)
        self._param_leaves = leaves
        self.state = DeviceState(
            cache=model.new_cache(num_slots=num_slots, max_len=cache_len),
            last_token=jnp.zeros((num_slots,), jnp.int32))
        self.registry = BucketRegistry("plain step", buckets)

        def step(param_leaves, cache, last_token, inputs):
            return _plain_step(graphdef, param_leaves, treedef, cache, last_token, inputs)

        for rows in tqdm(self.registry.sizes, desc="compiling plain-step buckets",
                         disable=not show_progress, leave=False):
            self.registry.compile(
                rows, step, abstract(leaves), abstract(self.state.cache),
                abstract(self.state.last_token), abstract(self.empty_inputs(rows)),
                donate_argnames=("cache", "last_token"))

    def empty_inputs(self, rows: int) -> StepInputs:
        return empty_step_inputs(rows, self.num_slots)

    overlap = False  # plain decoding reads each step's tokens before the next dispatch

    def dispatch(self, batch: ScheduledStep):
        """Launches a scheduled step; returns what `collect` needs (no device read)."""
        rows = self.registry.pick(batch.num_rows)
        tokens = self.run(build_step_inputs(batch, rows, self.num_slots))
        sampled = list(batch.decodes) + [c.request for c in batch.prefills if c.completes_prompt]
        return sampled, tokens

    def collect(self, flight) -> list[tuple[Request, list[int]]]:
        """The new token of each request that sampled one."""
        sampled, tokens = flight
        tokens = np.asarray(tokens)
        return [(request, [int(tokens[request.slot])]) for request in sampled]

    def run(self, inputs: StepInputs) -> jax.Array:
        """Dispatches one step (asynchronously); returns the sampled tokens [N] (device)."""
        rows = inputs.row_slot.shape[0]
        cache, last_token, new_tokens = self.registry(
            rows, self._param_leaves, self.state.cache, self.state.last_token, inputs)
        self.state = DeviceState(cache=cache, last_token=last_token)
        return new_tokens
