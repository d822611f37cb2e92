"""The model runner: owns the device state and the compiled steps, for plain and speculative
decoding alike (plain decoding is the case without a drafter).

Compiled at start-up, each in a registry keyed by its bucket:
    prefill  per prefill row bucket T   prompt chunks (and the drafter's prefill)
    decode   per verify bucket B        verify and commit (step.decode)
    draft    per draft depth d          the next proposal (step.draft), with a drafter
    write    per written-slot count U   admissions and aborts scattered into the slot state
With `defer_commit` and a drafter that catches up (the draft LM), also:
    decode   per bucket B <= N, floor   verify, the drafter only recording the rows
    catch-up per window W               the drafter's forward over what floor steps recorded
Prefill and decode steps are compiled for greedy batches; the sampling variants
(SampleMode.DRAW, FILTER) of a bucket compile the first time a batch needs them.

A steady-state engine step dispatches a decode executable (and a draft one, unless the planner
drafts nothing) and reads back one packed array, whose copy to the host starts as soon as the
step is dispatched. Neither executable waits on the host or makes it wait: the host's next
step overlaps the device's work.

On a mesh with D data-parallel replicas, the prefill, decode and draft executables run each
replica on its own slots (sharding.MeshLayout.per_replica): T / D prompt rows and B / D
verify rows apiece, laid out by replica.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from lightspec_jax.models import Qwen3

from ..drafters import Drafter
from ..sampling import SampleMode
from . import step
from .batch import PrefillInputs, Readback, SlotRows, SlotState, write_slots
from .buckets import BucketRegistry, powers_of_two
from .scheduler import PrefillChunk
from .mesh_report import device_bytes
from .sharding import DATA, MeshLayout, to_host
from .verifier import ExactMatch


# The widest catch-up window: positions per slot one catch-up forward covers (a floor run of
# more steps takes several). N x W rows of the drafter's forward per executable.
CATCH_UP_WINDOW = 16


def abstract(tree):
    """ShapeDtypeStructs of a pytree of arrays (what `.lower()` compiles against)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


class ModelRunner:
    def __init__(self, target: Qwen3, drafter: Drafter | None, *, num_slots: int,
                 cache_len: int, max_depth: int, prefill_buckets: tuple[int, ...],
                 decode_buckets: tuple[int, ...], draft_depths: tuple[int, ...] = (),
                 verifier=None, show_progress: bool = True, layout: MeshLayout | None = None,
                 precompile_sampling: str = "none", row_tile: int | None = None,
                 defer_commit: bool = False, compile_on_first_use: bool = False):
        """layout: the shardings over a device mesh (engine/sharding.py); None: one device,
        and none of the code below places or constrains anything. precompile_sampling: which
        sampled variants of the prefill and decode steps compile now rather than on first use
        (EngineConfig.precompile_sampling); compile_on_first_use: none, every step compiles
        when first called (EngineConfig.compile_on_first_use). row_tile: the target's rows
        per tile in the batch-invariant mode (EngineConfig.batch_invariant); None: untiled.
        defer_commit: a step of at most one row per slot that drafts nothing (the planner's
        floor) leaves a drafter that catches up behind, and it catches up before the next
        step that commits (drafters/base.py), so the floor costs a plain step."""
        self.num_slots = n = num_slots
        self.max_depth = k = max(max_depth, 1)  # plain decoding keeps a 1-wide empty proposal
        self.cache_len = cache_len
        self.row_tile = row_tile
        self.drafter = drafter
        self.verifier = verifier or ExactMatch()
        self.columns = Readback(width=k + 1)
        defers = defer_commit and drafter is not None and drafter.catches_up
        self._behind = 0  # positions per slot the drafter may have missed (an upper bound)
        graphdef, t_state = nnx.split(target)
        self._t_leaves, t_treedef = jax.tree.flatten(t_state)
        self._d_leaves = drafter.param_leaves if drafter is not None else []
        self._embed = target.embed[...]  # [V, H]: all of the target that drafting reads
        self.layout = layout
        new_cache = lambda: target.new_cache(num_slots=n, max_len=cache_len)  # noqa: E731
        new_dcache = lambda: (drafter.new_cache(num_slots=n, cache_len=cache_len)  # noqa: E731
                              if drafter else None)
        new_state = self.empty_state
        out_shardings = {}
        if layout is None:
            self.cache, self.dcache, self.state = new_cache(), new_dcache(), new_state()
        else:
            # A target Engine.from_pretrained loaded onto the mesh (loading._load_target)
            # already holds these shardings: placing it moves nothing. Any other model given
            # is copied onto the mesh and stays where it is.
            self._t_leaves, self._embed = layout.place_target(t_state)
            self._d_leaves = layout.replicate(self._d_leaves)
            per_slot = lambda tree: layout.slot_shardings(tree, n)  # noqa: E731
            # The drafter's cache for twice the slots tells its per-slot leaves from its
            # global ones, whatever their lengths.
            wide = (None if drafter is None else jax.eval_shape(
                lambda: drafter.new_cache(num_slots=2 * n, cache_len=cache_len)))
            per_slot_d = lambda tree: layout.slot_shardings(tree, n, wide)  # noqa: E731
            kv_heads = layout.kv_heads(target.config)
            self.cache = layout.allocate(
                lambda: target.new_cache(num_slots=n, max_len=cache_len, num_kv_heads=kv_heads),
                layout.cache_shardings)
            self.dcache = layout.allocate(new_dcache, per_slot_d)
            self.state = layout.allocate(new_state, per_slot)
            # Outputs keep the inputs' shardings, so a donated cache stays sharded and the next
            # call matches the compiled executable; what the host reads is gathered by it.
            cache_s = layout.cache_shardings(self.cache)
            dcache_s, state_s = per_slot_d(self.dcache), per_slot(self.state)
            out_shardings = dict(  # first tokens [C] replicated; read-back, confidences [N, .]
                prefill=(cache_s, dcache_s, state_s, layout.replicated),
                decode=(cache_s, dcache_s, state_s, layout.host_rows, layout.host_rows),
                draft=(dcache_s, state_s), write=state_s, catch_up=dcache_s)
        verifier = self.verifier
        spec = abstract if layout is None else layout.abstract

        def jit_kwargs(step_name, **kwargs):
            if step_name in out_shardings:
                kwargs["out_shardings"] = out_shardings[step_name]
            return kwargs

        def merge(leaves):
            return nnx.merge(graphdef, jax.tree.unflatten(t_treedef, leaves))

        self.replicas = replicas = 1 if layout is None else layout.replicas
        for what, sizes in (("prefill", prefill_buckets), ("decode", decode_buckets)):
            if any(b % replicas for b in sizes):
                raise ValueError(f"{what} buckets {list(sizes)} must be multiples of the data "
                                 f"parallel size {replicas}: each replica takes B / D rows")

        if replicas > 1:  # what each replica holds of the per-slot arrays: its own slots
            slots = lambda tree: layout.slot_specs(tree, n)  # noqa: E731
            mine = (slots(self.cache), layout.slot_specs(self.dcache, n, wide),
                    slots(self.state))
            # A drafter's global statistics (the n-gram hit rates) are whole on every replica.
            shared = [spec == P() for spec in jax.tree.leaves(
                mine[1], is_leaf=lambda x: isinstance(x, P))]

        def per_replica(fn, inputs_spec, outputs_spec):
            """`fn` (t_leaves, d_leaves, cache, dcache, state, inputs) -> (cache, dcache,
            state, *outputs) run by each data-parallel replica on its own slots and rows
            (MeshLayout.per_replica); as it is on one replica."""
            if replicas == 1:
                return fn

            def one_replica(t_leaves, d_leaves, cache, dcache, state, inputs):
                out = fn(t_leaves, d_leaves, cache, dcache, state, inputs)
                # What every replica holds whole must leave the step as it came: a replica's
                # own update would part the copies.
                for same, a, b in zip(shared, jax.tree.leaves(dcache), jax.tree.leaves(out[1])):
                    if same and a is not b:
                        raise NotImplementedError(
                            f"{type(drafter).__name__} updates its global state in a step "
                            "that data parallelism splits over the replicas")
                return out
            return layout.per_replica(one_replica, in_specs=(P(), P(), *mine, inputs_spec),
                                      out_specs=(*mine, *outputs_spec))

        def prefill_fn(mode):
            # Each replica prefills its own slots' prompt rows (T / D of them: Scheduler
            # splits the row budget, `prefill` lays the rows out per replica).
            def fn(t_leaves, d_leaves, cache, dcache, state, inputs):
                return step.prefill(merge(t_leaves), drafter, d_leaves, cache, dcache, state,
                                    inputs, mode=mode, row_tile=row_tile)
            return per_replica(fn, P(DATA), (P(DATA),))

        def decode_fn(rows, mode, commit=True):
            # Each replica verifies B / D rows of its own N / D slots, its fill's top-B / D
            # taken over them (the engine sizes B so that every replica's decoding slots get
            # their rows: scheduler.rows_needed).
            def fn(t_leaves, d_leaves, cache, dcache, state, extra):
                return step.decode(merge(t_leaves), drafter, verifier, d_leaves, cache, dcache,
                                   state, extra, num_rows=rows // replicas, mode=mode,
                                   row_tile=row_tile, commit_drafter=commit)
            extra_spec = None if replicas == 1 else layout.slot_specs(
                verifier.empty_inputs(n, k), n)
            return per_replica(fn, extra_spec, (P(DATA), P(DATA)))

        def draft_fn(depth):
            def fn(embed, d_leaves, dcache, state):
                return step.draft(embed, drafter, verifier, d_leaves, dcache, state,
                                  depth=depth)
            if replicas == 1 or any(shared):  # global statistics: one program over all slots
                return fn
            return layout.per_replica(fn, in_specs=(P(), P(), *mine[1:]), out_specs=mine[1:])

        def catch_up_fn(window):
            def fn(d_leaves, dcache, state):
                return step.catch_up(drafter, d_leaves, dcache, state, window=window)
            if replicas == 1 or any(shared):
                return fn
            return layout.per_replica(fn, in_specs=(P(), *mine[1:]), out_specs=mine[1])

        mesh = None if layout is None else layout.mesh
        self.prefill_registry = BucketRegistry("prefill step", prefill_buckets, mesh=mesh)
        self.decode_registry = BucketRegistry("decode step", decode_buckets, mesh=mesh)
        # Every depth up to K is defined; those the policy does not plan compile on first use.
        self.draft_registry = BucketRegistry("draft step", range(1, k + 1) if drafter else (),
                                             mesh=mesh)
        self.write_registry = BucketRegistry("slot write", powers_of_two(n, base=4), mesh=mesh)
        # Floor steps verify one row per slot: the buckets up to N's record instead of commit.
        home = self.decode_registry.pick(n)
        self._floor_buckets = frozenset(b for b in decode_buckets if b <= home and defers)
        self.catch_up_registry = BucketRegistry(
            "drafter catch-up", powers_of_two(CATCH_UP_WINDOW) if defers else (), mesh=mesh)
        t_abs, d_abs = spec(self._t_leaves), spec(self._d_leaves)
        cache_abs, dcache_abs, state_abs = (spec(x) for x in
                                            (self.cache, self.dcache, self.state))
        donate = ("cache", "dcache", "state")
        extra_abs = spec(verifier.empty_inputs(n, k))
        eager = {"none": SampleMode.GREEDY, "temperature": SampleMode.DRAW,
                 "all": SampleMode.FILTER}[precompile_sampling]
        for mode in SampleMode:  # greedy now, the others now or when first needed (lazy)
            lazy = mode > eager
            for t in self.prefill_registry.sizes:
                self.prefill_registry.define(
                    (t, mode), prefill_fn(mode), t_abs, d_abs, cache_abs, dcache_abs, state_abs,
                    spec(PrefillInputs.empty(t, n, replicas)), lazy=lazy,
                    **jit_kwargs("prefill", donate_argnames=donate))
            for b in self.decode_registry.sizes:
                for commit in (True, False) if b in self._floor_buckets else (True,):
                    key = (b, mode) if commit else (b, mode, False)
                    self.decode_registry.define(key, decode_fn(b, mode, commit), t_abs, d_abs,
                                                cache_abs, dcache_abs, state_abs, extra_abs,
                                                lazy=lazy,
                                                **jit_kwargs("decode", donate_argnames=donate))
        for d in self.draft_registry.sizes:
            self.draft_registry.define(d, draft_fn(d), spec(self._embed), d_abs, dcache_abs,
                                       state_abs,
                                       lazy=d not in draft_depths,
                                       **jit_kwargs("draft", donate_argnames=("dcache", "state")))
        for w in self.catch_up_registry.sizes:
            self.catch_up_registry.define(w, catch_up_fn(w), d_abs, dcache_abs, state_abs,
                                          **jit_kwargs("catch_up", donate_argnames=("dcache",)))
        for u in self.write_registry.sizes:
            self.write_registry.define(u, write_slots, state_abs,
                                       spec(SlotRows.empty(u, n)),
                                       **jit_kwargs("write", donate_argnames=("state",)))
        registries = (self.prefill_registry, self.decode_registry, self.draft_registry,
                      self.write_registry, self.catch_up_registry)
        if compile_on_first_use:
            for registry in registries:
                registry.defer_all()
        work = [(r, key) for r in registries for key in r.pending]
        for registry, key in tqdm(work, desc="compiling device steps",
                                  disable=not show_progress, leave=False):
            registry.build(key)

    def warm_up(self) -> None:
        """Runs every compiled prefill, decode and draft executable once on an empty batch.

        An executable's first run costs far more than the next ones: on the 2-core CPU a
        decode step at B = 64 took 30.5 ms the first time and 12.4 / 11.4 ms after, a draft
        step of depth 3 added 15 ms the first time (BENCHMARKS.md, eleventh session). A dynamic
        engine uses a dozen or more executables, and with its cost tables read from the cache
        (no sweep to run them) those first runs landed in its first requests' steps - 10% of
        a c=64 run's first repeat. Every row of an empty batch is padding: its cache writes
        are dropped and no slot changes, so this leaves the engine as it was, requests none.
        """
        if to_host(self.state.active).any():
            raise RuntimeError("warm_up() needs an idle runner: slots hold requests, and an "
                               "empty batch's state would replace theirs")
        n = self.num_slots
        for key in self.prefill_registry.compiled:
            self.cache, self.dcache, self.state, _ = self.prefill_registry(
                key, self._t_leaves, self._d_leaves, self.cache, self.dcache, self.state,
                PrefillInputs.empty(key[0], n, self.replicas))
        extra = self.verifier.empty_inputs(n, self.max_depth)
        decodes = self.decode_registry.compiled
        for key in decodes:
            self.decode(key[0], 0, extra, mode=key[1], commit=len(key) == 2)
        home = self.decode_registry.pick(n)
        for depth in self.draft_registry.compiled:
            self.decode(home, depth, extra)
        for window in self.catch_up_registry.compiled:  # no slot is behind: nothing changes
            self.dcache = self.catch_up_registry(window, self._d_leaves, self.dcache,
                                                 self.state)
        self._behind = 0
        if self.prefill_registry.compiled or decodes:
            jax.block_until_ready((self.cache, self.dcache, self.state))
        self.state = self.place_state(self.empty_state())

    def empty_state(self) -> SlotState:
        """A slot state with no request (what the steps compile against), unplaced."""
        return SlotState.empty(self.num_slots, self.max_depth, self.verifier.support)

    def place_state(self, state: SlotState) -> SlotState:
        """`state` on the devices the compiled steps expect (split over the mesh's slots)."""
        if self.layout is None:
            return state
        return jax.device_put(state, self.layout.slot_shardings(state, self.num_slots))

    @property
    def compile_seconds(self) -> float:
        return sum(r.compile_seconds for r in (self.prefill_registry, self.decode_registry,
                                               self.draft_registry, self.write_registry,
                                               self.catch_up_registry))

    def device_bytes(self) -> dict[str, dict[int, int]]:
        """Bytes each device holds (device id -> bytes) of the target's parameters, the
        drafter's, the target's KV cache and the drafter's cache, read from the arrays' shards
        (mesh_report.device_bytes). On one device: the whole of each."""
        parts = dict(target=self._t_leaves, drafter=self._d_leaves, kv=self.cache,
                     draft_cache=self.dcache)
        return {name: device_bytes(tree) for name, tree in parts.items()}

    # --- dispatch (never waits for the device) ----------------------------------------------

    def write(self, writes) -> None:
        """Scatters (slot, admitted request or None for a slot left by an abort) into the slot
        state: an admitted request's sampling values, seed, stop ids and allowance."""
        rows = SlotRows.pack(writes, self.write_registry.pick(len(writes)), self.num_slots)
        self.state = self.write_registry(len(rows.slot), self.state, rows)

    def prefill(self, chunks: tuple[PrefillChunk, ...]) -> tuple[jax.Array, np.ndarray]:
        """Dispatches prompt chunks -> (first tokens [C] on the device, where each completing
        chunk's token sits in it [completing chunks], in `chunks` order).

        With D data-parallel replicas the rows are D blocks of T / D, one per replica
        (PrefillInputs.pack)."""
        n, d = self.num_slots, self.replicas
        rows = self.prefill_registry.pick(PrefillInputs.rows_needed(chunks, n, d))
        mode = max((c.request.params.sample_mode for c in chunks if c.completes_prompt),
                   default=SampleMode.GREEDY)
        inputs, where = PrefillInputs.pack(chunks, rows, n, d)
        self.cache, self.dcache, self.state, tokens = self.prefill_registry(
            (rows, SampleMode(mode)), self._t_leaves, self._d_leaves, self.cache, self.dcache,
            self.state, inputs)
        tokens.copy_to_host_async()
        return tokens, where

    def decode(self, rows: int, depth: int, extra=(), mode: int = SampleMode.GREEDY, *,
               span: int | None = None, commit: bool | None = None
               ) -> tuple[jax.Array, jax.Array]:
        """Dispatches one decode step over a `rows` bucket, then drafting `depth` tokens
        (none at 0); `mode`: the SampleMode the decoding slots' requests need. Returns (packed
        read-back [N, K+1+5], verified confidences [N, K]) on the device.

        commit: whether the drafter commits the rows; None: unless the step drafts nothing
        over a floor bucket of a runner that defers (`defer_commit`). A step that does not
        commit leaves the drafter behind by at most `span` positions per slot (the most rows
        one slot holds: the verified depth + 1; None: K + 1), which the next step that commits
        catches up first."""
        mode = SampleMode(mode)
        if commit is None:
            commit = not (depth == 0 and rows in self._floor_buckets)
        if commit:
            self._catch_up()
        elif rows not in self._floor_buckets:
            raise ValueError(f"the {rows}-row decode step always commits the drafter "
                             f"(floor buckets: {sorted(self._floor_buckets)})")
        else:
            self._behind += self.max_depth + 1 if span is None else span
        key = (rows, mode) if commit else (rows, mode, False)
        self.cache, self.dcache, self.state, readback, conf = self.decode_registry(
            key, self._t_leaves, self._d_leaves, self.cache, self.dcache, self.state, extra)
        readback.copy_to_host_async()
        if depth > 0 and self.drafter is not None:
            self.dcache, self.state = self.draft_registry(depth, self._embed, self._d_leaves,
                                                          self.dcache, self.state)
        return readback, conf

    def _catch_up(self) -> None:
        """Dispatches the drafter's catch-up over what floor steps left it behind by: windows
        of up to CATCH_UP_WINDOW positions per slot, each from where the last one stopped."""
        behind, self._behind = self._behind, 0
        widest = self.catch_up_registry.sizes[-1] if behind else 0
        while behind > 0:
            window = self.catch_up_registry.pick(min(behind, widest))
            self.dcache = self.catch_up_registry(window, self._d_leaves, self.dcache,
                                                 self.state)
            behind -= window

    @property
    def floor_buckets(self) -> frozenset[int]:
        """The decode buckets whose floor steps record instead of commit (none unless the
        runner defers)."""
        return self._floor_buckets

    @property
    def behind(self) -> int:
        """Positions per slot the drafter may be behind (an upper bound): what the next step
        that commits catches up first."""
        return self._behind

    def discard_catch_up(self) -> None:
        """Forgets what floor steps left the drafter behind by: for synthetic states whose
        drafter cache nothing reads (the cost sweep's)."""
        self._behind = 0
