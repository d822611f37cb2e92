"""What an engine compiles for its configuration, decided once at construction (host only):
the drafter a policy needs, the draft depths it may plan, the verify and prefill buckets
(rounded up to the data-parallel size on a mesh), the KV strip length and the mesh layout.
The engine (engine.py) builds its runner and planner from these and says what it built
(`announce`); nothing here runs per step.

Axis legend: N slots (max_num_seqs), K max draft depth, D data-parallel replicas.
"""

from __future__ import annotations

import dataclasses
import logging

import jax

from ..config import EngineConfig, Policy
from ..drafters import Drafter, NgramDrafter
from .buckets import midpoint_buckets, powers_of_two
from .sharding import MeshLayout, engine_mesh

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EngineShapes:
    drafter: Drafter | None  # the one given, or the n-gram drafter method="ngram" makes
    max_depth: int  # K; 0 without speculation
    depths: tuple[int, ...]  # draft depths the policy may plan (() without speculation)
    prefill_buckets: tuple[int, ...]  # prompt rows per prefill step (multiples of D)
    decode_buckets: tuple[int, ...]  # verify rows B (multiples of D)
    cache_len: int  # KV strip length per slot
    mesh: object | None  # jax.sharding.Mesh, or None on one device
    layout: MeshLayout | None

    @property
    def speculative(self) -> bool:
        return self.drafter is not None


def engine_shapes(config: EngineConfig, model, drafter: Drafter | None) -> EngineShapes:
    """The shapes for `config` and a Qwen3 `model`; raises ValueError for a drafter the policy
    cannot use (or a policy without one) and for buckets or meshes that cannot serve."""
    spec = config.speculative
    speculative = spec.policy is not Policy.NONE
    if speculative and drafter is None and spec.method == "ngram":
        drafter = NgramDrafter(min_n=spec.ngram_min, max_n=spec.ngram_max,
                                shared=spec.shares_ngrams)
    if speculative and drafter is None:
        raise ValueError(f"policy {spec.policy.value!r} needs a drafter "
                         "(drafter_path=... or drafter=..., or method='ngram', which needs "
                         "no model)")
    if drafter is not None and spec.method is not None and drafter.method != spec.method:
        raise ValueError(f"method {spec.method!r} was asked for but the drafter given is "
                         f"{type(drafter).__name__} (method {drafter.method!r})")
    if drafter is not None and not speculative:
        raise ValueError("a drafter was given with policy 'none', which would ignore it: "
                         "choose a speculative policy (SpeculativeConfig(policy='dynamic', "
                         "num_speculative_tokens=K)) or drop the drafter")
    n = config.max_num_seqs
    k = spec.num_speculative_tokens if speculative else 0
    if speculative:
        decode_buckets = config.verify_buckets or midpoint_buckets(n * (k + 1))
        if decode_buckets[-1] < n * (k + 1):
            raise ValueError(f"verify_buckets must reach max_num_seqs * (K + 1) = "
                             f"{n * (k + 1)}, got {decode_buckets}")
    else:
        decode_buckets = powers_of_two(n)
    parallel = drafter is not None and drafter.kind == "parallel"
    if parallel:
        drafter.check_max_depth(k)
    depths = ()
    if speculative:
        # Dynamic drafting chooses among depths 1..K: draft forwards (autoregressive) or
        # block rows (a block drafter that cuts its block: Drafter.block_lead). One that
        # runs its whole block whatever it reads out has one depth.
        choose = not parallel or drafter.block_lead is not None
        depths = (tuple(range(1, k + 1)) if spec.policy is Policy.DYNAMIC and choose
                  else (k,))
    mesh = engine_mesh(config)
    prefill_buckets, layout = config.buckets, None
    if mesh is not None:
        layout = MeshLayout.for_target(mesh, model.config, num_slots=n)
        # Each data-parallel replica takes T / D prompt rows and B / D verify rows of its
        # own slots: buckets round up to multiples of D.
        r = layout.replicas
        if config.max_num_batched_tokens < r:
            raise ValueError(f"max_num_batched_tokens ({config.max_num_batched_tokens}) "
                             f"must be at least the data parallel size ({r}): each "
                             "replica prefills its share of it")
        prefill_buckets, decode_buckets = (tuple(sorted({-(-b // r) * r for b in sizes}))
                                           for sizes in (prefill_buckets, decode_buckets))
    return EngineShapes(drafter=drafter, max_depth=k, depths=depths,
                        prefill_buckets=tuple(prefill_buckets),
                        decode_buckets=tuple(decode_buckets),
                        # verify rows write up to K past seq_len and drafting up to K more
                        cache_len=_cache_len(config.max_model_len + 2 * k), mesh=mesh,
                        layout=layout)


def announce(config: EngineConfig, model, shapes: EngineShapes, *, synthetic: str,
             compile_seconds: float) -> None:
    """Warns of what a user would not expect from an engine built (synthetic acceptance, a
    max_model_len past the target's trained positions) and, with show_progress, says what
    it compiled. synthetic: the synthetic verifier's profile name ("" for a real verifier)."""
    if synthetic:
        log.warning("SYNTHETIC ACCEPTANCE (%s profile): verification outcomes are drawn, not "
                    "exact-matched; outputs are not the target's, only costs are real",
                    synthetic)
        print(f"lightspec_jax: SYNTHETIC ACCEPTANCE MODE ({synthetic}): "
              "outputs are not the target's; for benchmarking device costs only")
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and config.max_model_len > limit:
        log.warning("max_model_len=%d exceeds the target's max_position_embeddings=%d: "
                    "positions past it were never trained and degrade output",
                    config.max_model_len, limit)
    if config.show_progress:
        auto = " (dtype='auto')" if config.dtype == "auto" else ""
        where = (jax.default_backend() if shapes.mesh is None else
                 f"a {dict(shapes.mesh.shape)} {jax.default_backend()} mesh")
        prefill, decode = shapes.prefill_buckets, shapes.decode_buckets
        buckets = (f"{len(prefill)} prefill buckets {list(prefill)} and "
                   f"{len(decode)} decode buckets {list(decode)}")
        print(f"lightspec_jax: {model.dtype}{auto} on {where}; "
              + (f"{buckets} compile on first use" if config.compile_on_first_use else
                 f"compiled {buckets} in {compile_seconds:.1f} s"))


def _cache_len(max_model_len: int, block: int = 128, granule: int = 16) -> int:
    """KV strip length: whole attention blocks, so reads stop at the live context; short
    strips are one block rounded up to ``granule`` (the GPU attention kernel's smallest tile)."""
    step = granule if max_model_len <= block else block
    return -(-max_model_len // step) * step
