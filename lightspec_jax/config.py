"""User-facing configuration: frozen, keyword-only, validated at construction.

Facts measured at run time (cost tables, compile times) live in their own objects and are never
written back here.
"""

from __future__ import annotations

import dataclasses
import enum
import os

from .errors import RequestError


class Policy(str, enum.Enum):
    NONE = "none"  # plain decoding
    STATIC = "static"  # draft K, verify all of it (the classic MTP=K baseline)
    DYNAMIC = "dynamic"  # LightSpec
    DSPARK = "dspark"


# Drafting methods SpeculativeConfig.method accepts (None: inferred from the drafter).
DRAFT_METHODS = (None, "eagle3", "dflash", "dspark", "draft_lm", "ngram")
# Rows per tile of the batch-invariant mode (EngineConfig.batch_invariant): a step pads its
# rows to a multiple of it, so small buckets pay for up to this many rows.
BATCH_INVARIANT_ROW_TILE = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    policy: Policy | str = Policy.NONE
    num_speculative_tokens: int = 0  # K: the (maximum) draft depth
    # How drafts are made: "eagle3" | "dflash" | "dspark" | "draft_lm" (a checkpoint given as
    # the drafter; None: inferred from its config.json) or "ngram" (prompt lookup in the
    # request's own tokens, no model: speculation with only a target), matching n-grams of
    # ngram_max down to ngram_min tokens; with ngram_shared, a size that the request's own
    # tokens do not match is looked up in the other requests' tokens too (those decoding
    # beside it and the slots' earlier requests; None: on with exact verification, off with
    # probabilistic, whose sampled output would then follow the other requests' text). A
    # "dflash" or "dspark" drafter drafts its whole block in one forward:
    # num_speculative_tokens <= its block_size - 1 (dflash) or block_size (dspark, whose
    # every block row drafts).
    method: str | None = None
    ngram_min: int = 1
    ngram_max: int = 3
    ngram_shared: bool | None = None
    # How a sampled request's drafts are verified. "exact": a draft is accepted when it equals
    # the target's own seeded sample - output identical to plain decoding with the same seeds.
    # "probabilistic": speculative rejection sampling against the drafter's distribution q
    # (drafts are sampled at the request's temperature, top-k and top-p) - output follows the
    # target's distribution exactly and more drafts are accepted, but it is not token for
    # token what plain decoding emits with the same seed. Greedy requests use exact match in
    # both. Every drafter supports it (an n-gram drafter's drafts are point masses, so it
    # accepts as exact match does).
    verification: str = "exact"
    # Exact verification only: draw sampled requests' drafts with the target's own sampling
    # noise for their position instead of taking the drafter's argmax. Output is unchanged
    # (token for token plain decoding's); drafts match the target's sample more often when
    # the drafter's distribution resembles the target's.
    coupled_drafts: bool = False
    # The drafter's distribution q is kept as its `proposal_support` most likely tokens (the
    # drafter samples from exactly that truncated q): probabilistic or coupled drafting.
    proposal_support: int = 32

    def __post_init__(self):
        try:
            object.__setattr__(self, "policy", Policy(self.policy))
        except ValueError:
            raise ValueError(f"unknown speculative policy {self.policy!r}; choose one of "
                             f"{[p.value for p in Policy]}") from None
        k = self.num_speculative_tokens
        if not isinstance(k, int) or k < 0 or k > 15:
            raise ValueError(f"num_speculative_tokens must be an int in [0, 15] (the verify "
                             f"width K+1 is at most 16), got {k!r}")
        if self.policy is not Policy.NONE and k == 0:
            raise ValueError(f"policy {self.policy.value!r} needs num_speculative_tokens >= 1")
        if self.method not in DRAFT_METHODS:
            raise ValueError(f"unknown speculative method {self.method!r}; choose one of "
                             f"{[m for m in DRAFT_METHODS if m]} (or None: from the drafter)")
        if self.verification not in ("exact", "probabilistic"):
            raise ValueError(f"verification must be 'exact' or 'probabilistic', got "
                             f"{self.verification!r}")
        if self.coupled_drafts and self.verification != "exact":
            raise ValueError("coupled_drafts couples drafts to the target's own sample, which "
                             "only exact verification uses; probabilistic verification "
                             "samples its drafts from q by itself")
        if (not isinstance(self.proposal_support, int) or isinstance(self.proposal_support, bool)
                or not 1 <= self.proposal_support <= 1024):
            raise ValueError(f"proposal_support must be an int in [1, 1024], got "
                             f"{self.proposal_support!r}")
        if not (isinstance(self.ngram_min, int) and isinstance(self.ngram_max, int)
                and 1 <= self.ngram_min <= self.ngram_max):
            raise ValueError(f"n-gram sizes need 1 <= ngram_min <= ngram_max, got "
                             f"{self.ngram_min!r}, {self.ngram_max!r}")
        if self.ngram_shared is not None and not isinstance(self.ngram_shared, bool):
            raise ValueError(f"ngram_shared must be a bool or None, got {self.ngram_shared!r}")

    @property
    def shares_ngrams(self) -> bool:
        """Whether an n-gram drafter looks up the other requests' tokens (ngram_shared, or
        by default with exact verification)."""
        if self.ngram_shared is not None:
            return self.ngram_shared
        return self.verification == "exact"


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lightspec_jax", "jax_cache")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    max_num_seqs: int = 16  # N: request slots decoded together
    max_model_len: int = 2048  # prompt + generated tokens per request
    # Parameter and activation dtype. "auto": bfloat16 on a GPU or TPU, float32 on a CPU, where
    # bfloat16 matmuls run 4-60x slower (no native bf16 arithmetic in XLA's CPU backend).
    dtype: str = "auto"
    # Prompt rows one step may prefill (its largest prefill bucket); long prompts are split
    # into chunks so they never stall running decodes for their whole length. Decode rows
    # run in their own executable, sized by the verify buckets.
    max_num_batched_tokens: int = 256
    # While requests decode, waiting requests enter free slots at most once every this many
    # engine steps (1: every step). Each admission costs a prefill dispatch and a forward
    # whatever its size, so fewer, larger ones cost less, for slots left idle up to
    # admission_interval - 1 steps. With nothing decoding, requests are admitted at once.
    admission_interval: int = 1
    # Compiled prefill row-count buckets; None = powers of two from 8 and their midpoints (8,
    # 12, 16, 24, ...) up to max_num_batched_tokens (engine/buckets.midpoint_buckets).
    row_buckets: tuple[int, ...] | None = None
    speculative: SpeculativeConfig = dataclasses.field(default_factory=SpeculativeConfig)
    # Compiled verify-row buckets of the speculative step; None = powers of two and their
    # midpoints up to max_num_seqs * (K + 1). With data parallelism each rounds up to a
    # multiple of data_parallel_size (each replica verifies B / D rows).
    verify_buckets: tuple[int, ...] | None = None
    # The planner's cost tables: loaded from this JSON file when it exists, else measured at
    # start-up by the bucket sweep (and saved here when a path is given).
    cost_table_path: str | None = None
    refresh_costs: bool = True  # fold measured step times into the cost tables while serving
    # Speculative serving dispatches step i+1 before reading step i (planning, input building
    # and streaming overlap device work); False reads every step before the next dispatch.
    overlap: bool = True
    # Benchmarks only: draw verification outcomes and draft confidences from a workload profile
    # ("chat", "code", "math"; see planner/synthetic.py) instead of exact match, for untrained or
    # random-weight models. Device costs stay real; emitted tokens are NOT the target's.
    synthetic_acceptance: str | None = None
    # Persistent XLA compilation cache (None disables it); a second start is then fast.
    compilation_cache_dir: str | None = dataclasses.field(default_factory=_default_cache_dir)
    # Cost tables measured by the start-up bucket sweep, cached by model, drafter, dtype,
    # buckets, device and versions (any change misses), so a second start skips the sweep;
    # the online refresh writes the cache back. "auto": beside compilation_cache_dir (off
    # when that is None); None: off. An explicit cost_table_path takes precedence.
    cost_cache_dir: str | None = "auto"
    # Raise if anything compiles while serving: every device step must come from the registry.
    forbid_recompile: bool = True
    # The steps that sample at a temperature, and those that also filter by top-k / top-p,
    # are variants of the greedy ones. By default ("none") each compiles the first time a
    # batch needs it, which stalls that step for the compile (0.3-2 s per bucket on a CPU,
    # less from the compilation cache). "temperature" compiles the sampling variants at
    # start-up, "all" the filtering ones too (up to three times the compile work, no stall
    # while serving). Serving sampled requests from the start, set it.
    precompile_sampling: str = "none"
    # Compile every device step the first time a batch needs it instead of at start-up (what
    # precompile_sampling does for the sampling variants): the engine starts without
    # compiling, and each bucket's first step stalls for its compile (from the compilation
    # cache, briefly).
    # For short jobs, notebooks and tests that touch few of the buckets; a server wants the
    # default. A dynamic policy's start-up sweep still compiles every decode bucket it times
    # (none with a cost table given or cached). Serving-time compiles stay counted apart, so
    # forbid_recompile still catches anything compiled outside the engine's own steps.
    compile_on_first_use: bool = False
    # Batch-invariant mode: every row of the target's forward is computed in a fixed order,
    # BATCH_INVARIANT_ROW_TILE rows at a time (models/layers.over_row_tiles), so a row's logits
    # do not depend on the batch, its place in it, the verify width or the cache length. Then
    # greedy bfloat16 output equals a target-only run of any batch shape, speculative included
    # (float32 needs no such mode on this CPU; see the README's guarantee table). One device
    # only; costs throughput (BENCHMARKS.md, "Batch-invariant mode").
    batch_invariant: bool = False
    seed: int = 0  # engine-level randomness for requests sampled without their own seed
    show_progress: bool = True  # progress bar while compiling buckets
    # Serving over several devices (engine/sharding.py): a ('data', 'model') jax Mesh of the
    # first data_parallel_size x tensor_parallel_size visible devices; the model's heads, MLP
    # and vocabulary split over 'model', the request slots over 'data'. Or an explicit `mesh`
    # with exactly those two axis names (then leave both sizes at 1). (1, 1) and no mesh: one
    # device, exactly the single-device engine.
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    mesh: object | None = None  # jax.sharding.Mesh with axes ('data', 'model')

    def __post_init__(self):
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens",
                     "admission_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be 'auto', 'bfloat16', 'float16' or 'float32', got "
                             f"{self.dtype!r}")
        if self.row_buckets is not None:
            buckets = tuple(sorted(set(self.row_buckets)))
            if not buckets or buckets[0] < 1:
                raise ValueError(f"row_buckets must be positive ints, got {self.row_buckets!r}")
            if buckets[-1] < self.max_num_batched_tokens:
                raise ValueError(f"the largest row bucket ({buckets[-1]}) must cover "
                                 f"max_num_batched_tokens ({self.max_num_batched_tokens})")
            object.__setattr__(self, "row_buckets", buckets)
        if self.precompile_sampling not in ("none", "temperature", "all"):
            raise ValueError(f"precompile_sampling must be 'none', 'temperature' or 'all', got "
                             f"{self.precompile_sampling!r}")
        if not isinstance(self.compile_on_first_use, bool):
            raise ValueError(f"compile_on_first_use must be a bool, got "
                             f"{self.compile_on_first_use!r}")
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be a bool, got {self.batch_invariant!r}")
        if self.synthetic_acceptance not in (None, "chat", "code", "math"):
            raise ValueError(f"synthetic_acceptance must be None, 'chat', 'code' or 'math', got "
                             f"{self.synthetic_acceptance!r}")
        if self.verify_buckets is not None:
            buckets = tuple(sorted(set(self.verify_buckets)))
            if not buckets or buckets[0] < 1:
                raise ValueError(f"verify_buckets must be positive ints, got {self.verify_buckets!r}")
            object.__setattr__(self, "verify_buckets", buckets)
        if self.batch_invariant and (self.mesh is not None or self.tensor_parallel_size != 1
                                     or self.data_parallel_size != 1):
            # Sharded matmuls reduce over devices in an order of the collective's choosing.
            raise ValueError("batch_invariant=True serves on one device: leave mesh unset and "
                             "tensor_parallel_size = data_parallel_size = 1")
        self._check_parallelism()

    def _check_parallelism(self) -> None:
        """Sizes, or a mesh, that fit the slots and the visible devices (the model's head
        counts are checked when the engine gets its model: engine/sharding.py)."""
        for name in ("tensor_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        sizes = (self.tensor_parallel_size, self.data_parallel_size)
        if self.mesh is not None:
            if sizes != (1, 1):
                raise ValueError(f"give either mesh= or tensor_parallel_size / "
                                 f"data_parallel_size, not both (got a mesh and "
                                 f"tensor_parallel_size={sizes[0]}, "
                                 f"data_parallel_size={sizes[1]})")
            import jax

            if not isinstance(self.mesh, jax.sharding.Mesh):
                raise ValueError(f"mesh must be a jax.sharding.Mesh, got "
                                 f"{type(self.mesh).__name__}")
            if tuple(self.mesh.axis_names) != ("data", "model"):
                raise ValueError(f"mesh axes must be ('data', 'model'), got "
                                 f"{tuple(self.mesh.axis_names)}")
            data = self.mesh.shape["data"]
        else:
            data = self.data_parallel_size
            if sizes != (1, 1):
                import jax

                visible = jax.device_count()
                if sizes[0] * sizes[1] > visible:
                    raise ValueError(
                        f"tensor_parallel_size={sizes[0]} x data_parallel_size={sizes[1]} needs "
                        f"{sizes[0] * sizes[1]} devices, but {visible} are visible "
                        f"({jax.default_backend()}); on a CPU, set XLA_FLAGS="
                        f"--xla_force_host_platform_device_count=N before jax starts")
        if self.max_num_seqs % data:
            raise ValueError(f"max_num_seqs ({self.max_num_seqs}) must be a multiple of the data "
                             f"parallel size ({data}): the request slots split evenly over "
                             f"the 'data' axis")

    @property
    def uses_mesh(self) -> bool:
        """Whether the engine serves over a mesh (False: the single-device engine)."""
        sizes = (self.tensor_parallel_size, self.data_parallel_size)
        return self.mesh is not None or sizes != (1, 1)

    @property
    def resolved_cost_cache_dir(self) -> str | None:
        if self.cost_cache_dir != "auto":
            return self.cost_cache_dir
        if self.compilation_cache_dir is None:
            return None
        return os.path.join(os.path.dirname(os.path.abspath(self.compilation_cache_dir)),
                            "cost_tables")

    @property
    def resolved_dtype(self) -> str:
        """The dtype the engine uses: `dtype`, with "auto" resolved for the default backend."""
        if self.dtype != "auto":
            return self.dtype
        import jax

        return "float32" if jax.default_backend() == "cpu" else "bfloat16"

    @property
    def buckets(self) -> tuple[int, ...]:
        """The compiled row counts of the plain (prefill + decode) step."""
        if self.row_buckets is not None:
            return self.row_buckets
        from .engine.buckets import midpoint_buckets

        return midpoint_buckets(self.max_num_batched_tokens, start=8)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None  # per-request reproducibility; None draws from the engine seed
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature < float("inf"):
            raise RequestError(f"temperature must be a finite float >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError(f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**32):
            raise RequestError(f"seed must be None or an int in [0, 2**32), got {self.seed!r}")
        stops = tuple(self.stop_token_ids)
        if any(not isinstance(t, int) or t < 0 for t in stops):
            raise RequestError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def sample_mode(self) -> int:
        """The lightspec_jax.sampling.SampleMode this request needs: 0 greedy, 1 a draw at a
        temperature, 2 a draw after top-k / top-p (the device branches on no value of it)."""
        if self.greedy:
            return 0
        return 2 if (self.top_k > 0 or self.top_p < 1.0) else 1

    @property
    def acceptance_class(self) -> int:
        """Requests that draft-accept alike share a class, for the planner's statistics: 0 is
        greedy, 1-8 are temperature bands 0.25 wide (the last holds T >= 1.75)."""
        if self.greedy or self.top_k == 1:  # top-1 sampling draws the argmax
            return 0
        return 1 + min(int(self.temperature / 0.25), 7)
