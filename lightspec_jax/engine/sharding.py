"""Tensor and data parallelism over a ('data', 'model') jax Mesh: where each array lives.

Only placement is decided here. The engine's steps stay the single-device functions: they are
compiled with their inputs and outputs placed by the NamedShardings below, and GSPMD inserts
the collectives (the all-reduces after o_proj and down_proj, the vocabulary-sharded
embedding lookup and argmax, gathers of slot-sharded state). The axis names follow
tpu-inference (`tpu_inference/layers/common/sharding.py`: 'data' and 'model').

Tensor parallelism (M devices on 'model'), Megatron-style:
    q_proj [L, H, Q, D]   over Q        o_proj [L, Q, D, H]   over Q
    k_proj, v_proj [L, H, G, D] over G, and the KV cache [L, N, S, G, D] over G; when M > G
        each KV head is replicated M/G times, as vLLM and SGLang do (vLLM
        `model_executor/layers/linear.py` QKVParallelLinear, `num_kv_head_replicas`): the
        projections are repeated to M heads (head i -> copies M/G * i .. M/G * (i+1) - 1)
        and split over M with a cache of M heads, so each device holds the one KV head its
        query heads read (query head j reads copy j // (Q/M), which is head j // (Q/G): GQA
        unchanged). Fully replicating them instead made GSPMD all-gather the whole cache in
        every step.
    gate_proj, up_proj [L, H, I] over I  down_proj [L, I, H] over I
    embed [V, H] and lm_head [H, V] over V
    norms replicated (the RMSNorm weights [H] and the per-head q_norm / k_norm [D])
Data parallelism (D devices on 'data'): the request slots N, i.e. the KV caches' N axis and
every per-slot array (SlotState, the drafter's caches); the parameters are replicated over
'data'. The drafter (Eagle3, draft LM, DFlash) is replicated on 'model': its caches are
sharded over 'data' only.

Each step splits over the replicas (`per_replica`, a shard_map manual over 'data', used by
runner.py): replica r verifies B / D rows of its own N / D slots - its fill's top-B / D over
them, its rows' attention over its own KV - prefills its own slots' prompt rows (T / D) and
drafts for its own slots, with no collective over 'data' but the gathers of what the host
reads, and 1/D of each step's FLOPs per device (the mesh tests check both). The planner's
budget B is the sum over the replicas. So that B / D rows hold every decoding slot of the
busiest replica, the scheduler admits each request to the least-loaded replica and the
engine sizes B by the busiest one (scheduler.rows_needed); buckets round up to multiples of
D. A drafter with global statistics (P() leaves of its cache: the n-gram hit rates) drafts
as one GSPMD program, and may not change them in a split step. The steps are lowered under
the mesh (BucketRegistry), so each Pallas op, which GSPMD cannot split, runs its kernel per
device under a shard_map over 'model' (pallas_kernels.on_local_shards): the attention on the
device's own query and KV heads, fill / verify / commit on its whole copy of the per-slot
arrays.
`assemble_target` builds the placed leaves from per-shard reads
(checkpoint.qwen3.load_qwen3_sharded: Engine.from_pretrained on a mesh).

A mesh may span processes (multi-host; engine/multihost.py): what the host reads every step
is then whole on every device (`host_rows`), since a process reads only its own devices.

Axis legend: L layers, H hidden, Q query heads, G KV heads, D head dim, I intermediate,
V vocab, N slots, S cache length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lightspec_jax.models import KVCache, Qwen3Config

DATA, MODEL = "data", "model"

# Qwen3 parameter name -> the axis of its (stacked) value split over 'model'; None: replicated.
_TARGET_AXES = {
    "embed": 0, "lm_head": 1, "norm": None,
    "input_norm": None, "post_norm": None, "q_norm": None, "k_norm": None,
    "q_proj": 2, "k_proj": 2, "v_proj": 2, "o_proj": 1,
    "gate_proj": 2, "up_proj": 2, "down_proj": 1,
}
_KV_PROJECTIONS = ("k_proj", "v_proj")  # [L, H, G, D]: repeated when M > G


def make_mesh(*, tensor_parallel_size: int, data_parallel_size: int, devices=None) -> Mesh:
    """A (data, model) mesh over the first D x M of `devices` (default: all visible ones), in
    their listed order: neighbours in the list share a 'model' group."""
    devices = list(jax.devices() if devices is None else devices)
    m, d = tensor_parallel_size, data_parallel_size
    if m * d > len(devices):
        raise ValueError(f"a {d} x {m} (data x model) mesh needs {m * d} devices, "
                         f"{len(devices)} given")
    return Mesh(np.array(devices[:m * d]).reshape(d, m), (DATA, MODEL))


def _read_repeated(read, path: str, bounds: tuple, repeat: int, shape) -> np.ndarray:
    """The block `bounds` of a leaf whose axis 2 (K/V heads) is repeated `repeat` times:
    placed head j is stored head j // repeat, so read the stored heads covering the block,
    repeat them and cut."""
    index = [slice(a, b) for a, b in bounds]
    if repeat == 1:
        return read(path, tuple(index))
    a, b = bounds[2]
    first = a // repeat
    index[2] = slice(first, min(-(-b // repeat), shape[2]))
    block = np.repeat(read(path, tuple(index)), repeat, axis=2)  # [L, H, g*r, D]
    return block[:, :, a - first * repeat:b - first * repeat]


def engine_mesh(config) -> Mesh | None:
    """The EngineConfig's mesh: its `mesh`, one built from its sizes, or None (one device)."""
    if config.mesh is not None:
        return config.mesh
    if not config.uses_mesh:
        return None
    return make_mesh(tensor_parallel_size=config.tensor_parallel_size,
                     data_parallel_size=config.data_parallel_size)


def _path_names(path) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]


def leaf_paths(state) -> list[str]:
    """Each leaf's parameter path ("embed", "layers.q_proj"), in `jax.tree.flatten` order."""
    return [".".join(n for n in _path_names(path) if n != "value")
            for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]]


def _spec(ndim: int, axis: int | None, name: str) -> P:
    """A PartitionSpec of `ndim` entries splitting `axis` (None: none) over mesh axis `name`."""
    spec = [None] * ndim
    if axis is not None:
        spec[axis] = name
    return P(*spec)


@dataclasses.dataclass(frozen=True)
class MeshLayout:
    """The shardings of one engine's arrays over `mesh` (see the module docstring)."""

    mesh: Mesh
    kv_repeat: int  # copies of each KV head (M / G when M > G, else 1)

    @classmethod
    def for_target(cls, mesh: Mesh, cfg: Qwen3Config, *, num_slots: int) -> "MeshLayout":
        """Checks that `cfg` splits over the mesh's 'model' axis; raises ValueError naming the
        sizes that do not divide."""
        m, d = mesh.shape[MODEL], mesh.shape[DATA]
        for what, size in (("num_heads (query heads)", cfg.num_heads),
                           ("intermediate_size", cfg.intermediate_size),
                           ("vocab_size", cfg.vocab_size)):
            if size % m:
                raise ValueError(f"tensor_parallel_size {m} must divide the target's {what} "
                                 f"({size}); num_heads={cfg.num_heads}, "
                                 f"num_kv_heads={cfg.num_kv_heads}")
        g = cfg.num_kv_heads
        if g % m and m % g:
            raise ValueError(f"tensor_parallel_size {m} and the target's num_kv_heads ({g}) "
                             f"must divide one another: KV heads are split when M divides "
                             f"them and replicated when they divide M (num_heads="
                             f"{cfg.num_heads})")
        if num_slots % d:
            raise ValueError(f"max_num_seqs ({num_slots}) must be a multiple of the data "
                             f"parallel size ({d})")
        return cls(mesh, kv_repeat=max(m // g, 1))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def slot_rows(self) -> NamedSharding:
        """Per-slot arrays [N, ...]: N over 'data'."""
        return NamedSharding(self.mesh, P(DATA))

    @property
    def spans_processes(self) -> bool:
        """Whether the mesh holds devices of other processes (multi-host serving)."""
        return any(d.process_index != jax.process_index() for d in self.mesh.devices.flat)

    @property
    def host_rows(self) -> NamedSharding:
        """Per-slot arrays the host reads every step (the packed read-back, the verified
        confidences): split like the slots on one process; whole on every device when the
        mesh spans processes, so that each process reads every slot from its own devices
        (the step's executable gathers them; a process cannot read another's shards)."""
        return self.replicated if self.spans_processes else self.slot_rows

    def _on(self, ndim: int, axis: int | None, name: str) -> NamedSharding:
        return NamedSharding(self.mesh, _spec(ndim, axis, name))

    # --- parameters ---------------------------------------------------------------------

    def target_shardings(self, state) -> list[NamedSharding]:
        """One sharding per leaf of a Qwen3's nnx.State, in `jax.tree.flatten` order."""
        out = []
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            name = next((n for n in reversed(_path_names(path)) if n in _TARGET_AXES), None)
            if name is None:
                raise ValueError(f"no sharding rule for the target parameter "
                                 f"{'/'.join(_path_names(path))}: add it to _TARGET_AXES")
            out.append(self._on(np.ndim(leaf), _TARGET_AXES[name], MODEL))
        return out

    def _repeats_kv(self, names: list[str]) -> bool:
        return self.kv_repeat > 1 and any(n in _KV_PROJECTIONS for n in names)

    def place_target(self, state) -> tuple[list[jax.Array], jax.Array]:
        """The target's leaves, K/V heads repeated `kv_repeat` times, placed by
        `target_shardings` -> (leaves in `jax.tree.flatten` order, embed [V, H]). K/V leaves
        that hold the repeated heads already (M of them: a target Engine.from_pretrained read
        onto the mesh, loading._load_target) are placed as they are."""
        pairs = jax.tree_util.tree_flatten_with_path(state)[0]
        names = [_path_names(path) for path, _ in pairs]
        m = self.mesh.shape[MODEL]
        leaves = [jnp.repeat(leaf, self.kv_repeat, axis=2)  # [L, H, G*r, D]
                  if self._repeats_kv(name) and np.shape(leaf)[2] * self.kv_repeat == m
                  else leaf for name, (_, leaf) in zip(names, pairs)]
        leaves = jax.device_put(leaves, self.target_shardings(state))  # repeats keep ndim
        embed = next(x for name, x in zip(names, leaves) if "embed" in name)
        return leaves, embed

    def abstract_target(self, state) -> list[jax.ShapeDtypeStruct]:
        """What `place_target` places, as ShapeDtypeStructs carrying their shardings, for a
        model that is never loaded (`state` may hold ShapeDtypeStructs; the mesh may be a
        jax.sharding.AbstractMesh): sizes, per-device bytes and lowering at real scale."""
        out = []
        pairs = jax.tree_util.tree_flatten_with_path(state)[0]
        for (path, leaf), sharding in zip(pairs, self.target_shardings(state)):
            shape = list(np.shape(leaf))
            if self._repeats_kv(_path_names(path)):
                shape[2] *= self.kv_repeat  # [L, H, G*r, D]
            out.append(jax.ShapeDtypeStruct(tuple(shape), leaf.dtype, sharding=sharding))
        return out

    def stored_target(self, state) -> list[jax.ShapeDtypeStruct]:
        """`abstract_target` as a checkpoint stores it, for orbax to restore into: the K/V
        heads not repeated. Where the mesh repeats them (M > G) those leaves are replicated:
        each device reads the whole K/V projections (2 L H G D elements, small beside its
        shard of the rest) and makes its own copies (`repeat_stored`)."""
        out = []
        pairs = jax.tree_util.tree_flatten_with_path(state)[0]
        for (path, leaf), placed in zip(pairs, self.abstract_target(state)):
            if self._repeats_kv(_path_names(path)):
                placed = jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype,
                                              sharding=self.replicated)
            out.append(placed)
        return out

    def repeat_stored(self, state, leaves: list[jax.Array]) -> list[jax.Array]:
        """Leaves restored in `stored_target`'s shardings -> as `abstract_target` places
        them: the K/V heads repeated on the devices."""
        pairs = jax.tree_util.tree_flatten_with_path(state)[0]
        out = []
        for (path, _), leaf, placed in zip(pairs, leaves, self.abstract_target(state)):
            if self._repeats_kv(_path_names(path)):
                leaf = jax.jit(lambda x: jnp.repeat(x, self.kv_repeat, axis=2),  # [L, H, G*r, D]
                               out_shardings=placed.sharding)(leaf)
            out.append(leaf)
        return out

    def assemble_target(self, state, read: Callable[[str, tuple[slice, ...]], np.ndarray]
                        ) -> tuple[list[jax.Array], jax.Array]:
        """`place_target` from shards, without the whole model on the host: read(path, index)
        returns the block `index` (slices with int bounds) of the leaf at `path` ("embed",
        "layers.q_proj") as stored in `state` (K/V heads not repeated; `state` may hold
        ShapeDtypeStructs). Only this process's devices are filled, each distinct shard is
        read once and put on every device that holds it, then dropped."""
        leaves = []
        for path, leaf, placed in zip(leaf_paths(state), jax.tree.leaves(state),
                                      self.abstract_target(state)):
            repeat = self.kv_repeat if self._repeats_kv(path.split(".")) else 1
            groups: dict[tuple, list] = {}  # shard bounds -> its devices
            for device, index in placed.sharding.addressable_devices_indices_map(
                    placed.shape).items():
                bounds = tuple(s.indices(n)[:2] for s, n in zip(index, placed.shape))
                groups.setdefault(bounds, []).append(device)
            shards = []
            for bounds, devices in groups.items():
                block = _read_repeated(read, path, bounds, repeat, np.shape(leaf))
                shards += [jax.device_put(block, d) for d in devices]
            leaves.append(jax.make_array_from_single_device_arrays(placed.shape,
                                                                   placed.sharding, shards))
        embed = leaves[leaf_paths(state).index("embed")]
        return leaves, embed

    def replicate(self, tree):
        """The drafter's parameters (and host inputs): a full copy on every device."""
        return jax.device_put(tree, jax.tree.map(lambda _: self.replicated, tree))

    # --- per-slot arrays ----------------------------------------------------------------

    def kv_heads(self, cfg: Qwen3Config) -> int:
        """KV heads of the placed target and its cache: G x kv_repeat."""
        return cfg.num_kv_heads * self.kv_repeat

    def cache_shardings(self, cache: KVCache) -> KVCache:
        """The target's KV cache [L, N, S, G, D]: N over 'data', G over 'model'."""
        spec = P(None, DATA, None, MODEL, None)
        return KVCache(NamedSharding(self.mesh, spec), NamedSharding(self.mesh, spec))

    def slot_specs(self, tree, num_slots: int, wider=None):
        """Per-slot pytrees (SlotState, a drafter's cache, per-slot outputs) -> a PartitionSpec
        per leaf: KV caches [L, N, S, G, D] and arrays whose leading axis is N split N over
        'data'; anything else (a drafter's global statistics) replicated. wider: the same
        tree built for more slots (shapes suffice); given, a leaf is per-slot when its shape
        differs there, so a statistic that happens to be N long (the n-gram hit rates with
        N = max_n + 1) stays whole. A replicated drafter keeps its KV heads whole on every
        'model' device."""
        def rule(x, wide=None):
            if isinstance(x, KVCache):
                return KVCache(*(_spec(5, 1, DATA),) * 2)
            grows = np.ndim(x) >= 1 and np.shape(x)[0] == num_slots
            if wide is not None:
                grows = grows and np.shape(wide) != np.shape(x)
            return _spec(np.ndim(x), 0, DATA) if grows else P()
        is_kv = lambda x: isinstance(x, KVCache)  # noqa: E731
        if wider is None:
            return jax.tree.map(rule, tree, is_leaf=is_kv)
        return jax.tree.map(rule, tree, wider, is_leaf=is_kv)

    def slot_shardings(self, tree, num_slots: int, wider=None):
        """`slot_specs` as NamedShardings."""
        return jax.tree.map(lambda spec: NamedSharding(self.mesh, spec),
                            self.slot_specs(tree, num_slots, wider),
                            is_leaf=lambda x: isinstance(x, P))

    # --- one replica's share of a step --------------------------------------------------

    @property
    def replicas(self) -> int:
        """D: the data-parallel replicas; replica r holds slots [r N/D, (r+1) N/D)."""
        return self.mesh.shape[DATA]

    def per_replica(self, fn: Callable, in_specs, out_specs) -> Callable:
        """`fn` run by each replica on its own slots (jax.shard_map, manual over 'data'
        only: 'model' stays with GSPMD, so tensor parallelism inside is unchanged). Specs
        name 'data' alone (`slot_specs`; P() for what every replica holds whole). Not
        checked for varying values (check_vma): the model's loops start from constants, so
        `fn` must itself keep a P() output the same on every replica."""
        manual = frozenset({DATA}) if self.mesh.shape[MODEL] > 1 else frozenset()
        return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs,
                             axis_names=manual, check_vma=False)

    def allocate(self, make: Callable[[], Any], shardings_of: Callable[[Any], Any]):
        """Runs `make` (zeros) straight into its shardings: a cache is never whole on one
        device first."""
        shapes = jax.eval_shape(make)
        if not jax.tree.leaves(shapes):  # nothing to place (no drafter)
            return make()
        return jax.jit(make, out_shardings=shardings_of(shapes))()

    def abstract(self, tree):
        """ShapeDtypeStructs that carry each array's sharding (host numpy: replicated), so
        `.lower()` compiles the step for the placed inputs."""
        def one(x):
            sharding = x.sharding if isinstance(x, jax.Array) else self.replicated
            return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)
        return jax.tree.map(one, tree)


def to_host(x: jax.Array) -> np.ndarray:
    """A device array on the host, whole, on every process: read directly when this process
    holds all of it; else gathered from the other processes (a collective every process must
    call; outside the step loop only, e.g. start-up checks)."""
    if x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
