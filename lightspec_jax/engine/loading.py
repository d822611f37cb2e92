"""Engine.from_pretrained's loading: a target checkpoint and, optionally, a drafter for it.

The drafter's kind comes from its config.json (checkpoint.drafter_kind): an Eagle3 drafter
(EAGLE/SpecForge or speculators layout), a DFlash block drafter (z-lab layout), a DSpark
block drafter (DeepSpec layout) or a Qwen3 draft LM; SpeculativeConfig(method=...) must agree
with it, and method="ngram" takes none. Nothing is downloaded.
"""

from __future__ import annotations

import os

from ..config import EngineConfig, Policy
from ..tokenizer import Tokenizer, load_eos_ids
from .buckets import enable_compilation_cache


def load_pretrained(target_path: str, drafter_path: str | None, config: EngineConfig):
    """(target model, drafter or None, tokenizer or None, sorted EOS ids) for Engine()."""
    from ..checkpoint import (DFLASH, DRAFT_LM, DSPARK, EAGLE3, check_same_vocabulary,
                              drafter_kind, load_dflash, load_dspark, load_eagle3, load_qwen3)
    from ..drafters import DFlashDrafter, DraftLMDrafter, DSparkDrafter, Eagle3Drafter

    method = config.speculative.method
    if drafter_path is not None and config.speculative.policy is Policy.NONE:
        raise ValueError(f"drafter_path={drafter_path!r} was given with policy 'none', which "
                         "would ignore it: choose a speculative policy "
                         "(SpeculativeConfig(policy='dynamic', num_speculative_tokens=K))")
    if drafter_path is not None and method == "ngram":
        raise ValueError(f"method 'ngram' drafts from the request's own tokens and takes no "
                         f"drafter checkpoint, got drafter_path={drafter_path!r}")
    enable_compilation_cache(config.compilation_cache_dir)
    model = _load_target(target_path, config) or load_qwen3(target_path,
                                                           dtype=config.resolved_dtype)
    kind = None if drafter_path is None else drafter_kind(drafter_path)
    if kind is not None and method is not None and kind != method:
        raise ValueError(f"method {method!r} was asked for but {drafter_path!r} holds a "
                         f"{kind} drafter")
    drafter = None
    if kind == EAGLE3:
        # The target's embedding serves the drafter (SGLang's rule; Eagle3 training keeps
        # it frozen), so a stored copy of V x H values is not loaded.
        drafter = Eagle3Drafter(load_eagle3(drafter_path, target_config=model.config,
                                            dtype=config.resolved_dtype, load_embed=False))
    elif kind == DFLASH:
        # No embedding or lm_head of its own: the target's read the block in and out.
        drafter = DFlashDrafter(load_dflash(drafter_path, target_config=model.config,
                                            dtype=config.resolved_dtype), model)
    elif kind == DSPARK:
        # Its embed_tokens and lm_head are frozen copies of the target's, which serve.
        drafter = DSparkDrafter(load_dspark(drafter_path, target_config=model.config,
                                            dtype=config.resolved_dtype), model)
    elif kind == DRAFT_LM:
        draft_model = load_qwen3(drafter_path, dtype=config.resolved_dtype)
        check_same_vocabulary(target_path, model.config.vocab_size, drafter_path,
                              draft_model.config.vocab_size)
        drafter = DraftLMDrafter(draft_model)
    tok_path = os.path.join(target_path, "tokenizer.json")
    tokenizer = Tokenizer.from_file(tok_path) if os.path.isfile(tok_path) else None
    eos = set(model.config.eos_token_ids) | load_eos_ids(target_path)
    return model, drafter, tokenizer, sorted(eos)


def _load_target(target_path: str, config: EngineConfig):
    """The target read straight into the engine's mesh shardings, or None without a mesh
    (the whole model is loaded on the host then).

    Each process reads only what its devices hold (checkpoint.load_qwen3_placed): the
    slices of the safetensors tensors of a Hugging Face directory (where tensor_parallel_size
    exceeds the KV heads, each device the stored K/V head its copy repeats), or a converted
    checkpoint's arrays restored by orbax into the shardings (there the K/V projections whole
    on each device, then repeated); the host holds about one shard at a time. The arrays
    arrive in the shardings the engine's runner places the target in
    (MeshLayout.place_target), which then moves nothing.
    """
    import jax
    from flax import nnx

    from ..checkpoint import load_qwen3_placed
    from ..checkpoint.qwen3 import read_qwen3_config
    from .sharding import MeshLayout, engine_mesh

    mesh = engine_mesh(config)
    if mesh is None:
        return None
    layout = MeshLayout.for_target(mesh, read_qwen3_config(target_path),
                                   num_slots=config.max_num_seqs)
    model, leaves, _ = load_qwen3_placed(target_path, layout, dtype=config.resolved_dtype)
    nnx.update(model, jax.tree.unflatten(jax.tree.structure(nnx.state(model)), leaves))
    return model
