"""Checkpoints: Hugging Face directories and our converted (orbax) format."""

from __future__ import annotations

import os

from lightspec_jax.models import Qwen3

from .converted import is_converted, read_marker, restore_params, save_converted
from .qwen3 import abstract_qwen3, load_qwen3_hf, read_qwen3_config, resolve_dtype, save_qwen3_hf
from .safetensors_io import CheckpointError, TensorReader, read_json

__all__ = ["CheckpointError", "TensorReader", "check_same_vocabulary", "convert_qwen3",
           "is_converted", "load_qwen3", "save_qwen3_hf"]


def load_qwen3(path: str, *, dtype: str | None = None) -> Qwen3:
    """Loads a Qwen3 target from a Hugging Face directory or a converted one.

    dtype: the parameter/activation dtype; None keeps a converted checkpoint's own dtype and
    uses float32 for HF directories.
    """
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint path {path!r} is not a directory")
    if not is_converted(path):
        return load_qwen3_hf(path, dtype=dtype or "float32")
    saved = _converted_dtype(path)
    model = restore_params(abstract_qwen3(read_qwen3_config(path), saved), path)
    if dtype is not None and resolve_dtype(dtype) != saved:
        import jax
        from flax import nnx
        want = resolve_dtype(dtype)
        state = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda x: x.astype(want), state))
    return model


def load_qwen3_placed(path: str, layout, *, dtype: str | None = None):
    """A Qwen3 target read straight into a mesh's shardings (engine/sharding.py MeshLayout),
    each process reading only what its devices hold: a Hugging Face directory slice by slice
    from its safetensors (qwen3.load_qwen3_sharded), a converted one by orbax into the
    shardings (K/V heads the mesh repeats read whole, then repeated on the devices:
    MeshLayout.stored_target). Returns (the module, its placed leaves in `jax.tree.leaves`
    order, the embedding [V, H] among them)."""
    import jax
    from flax import nnx

    from lightspec_jax.engine.sharding import leaf_paths

    from .qwen3 import load_qwen3_sharded

    if not is_converted(path):
        return load_qwen3_sharded(path, layout, dtype=dtype or "float32")
    saved = _converted_dtype(path)
    model = abstract_qwen3(read_qwen3_config(path), saved)
    state = nnx.state(model, nnx.Param)
    model = restore_params(model, path, layout.stored_target(state))
    leaves = layout.repeat_stored(state, jax.tree.leaves(nnx.state(model, nnx.Param)))
    if dtype is not None and resolve_dtype(dtype) != saved:  # cast where each shard lies
        want = resolve_dtype(dtype)
        leaves = [x.astype(want) for x in leaves]
    return model, leaves, leaves[leaf_paths(state).index("embed")]


def _converted_dtype(path: str):
    marker = read_marker(path)
    if marker.get("model") != "qwen3":
        raise CheckpointError(f"{path} holds a converted {marker.get('model')!r}, not a qwen3 target")
    return resolve_dtype(marker["dtype"])


def convert_qwen3(hf_dir: str, out_dir: str, *, dtype: str = "bfloat16") -> Qwen3:
    """HF Qwen3 directory -> converted directory (orbax params + config + tokenizer files)."""
    cfg = read_qwen3_config(hf_dir)
    model = load_qwen3_hf(hf_dir, dtype=dtype)
    save_converted(model, out_dir, model_kind="qwen3", hf_config=cfg.to_hf(), source_dir=hf_dir)
    return model


from .eagle3 import (LEGACY_ARCHITECTURES, SPECULATORS_ARCHITECTURES,  # noqa: E402
                     load_eagle3, save_eagle3_hf)

from .dflash import ARCHITECTURES as DFLASH_ARCHITECTURES  # noqa: E402
from .dflash import is_dflash_config, load_dflash, save_dflash_hf  # noqa: E402
from .dspark import ARCHITECTURES as DSPARK_ARCHITECTURES  # noqa: E402
from .dspark import is_dspark_config, load_dspark, save_dspark_hf  # noqa: E402

__all__ += ["DFLASH", "DRAFT_LM", "DSPARK", "EAGLE3", "drafter_kind", "load_dflash",
            "load_dspark", "load_eagle3", "save_dflash_hf", "save_dspark_hf", "save_eagle3_hf"]

EAGLE3, DFLASH, DSPARK, DRAFT_LM = "eagle3", "dflash", "dspark", "draft_lm"


def drafter_kind(path: str) -> str:
    """What a drafter directory holds, from its config.json: EAGLE3 (either Eagle3 layout),
    DFLASH (a z-lab DFlash block drafter), DSPARK (a DeepSpec DSpark block drafter) or
    DRAFT_LM (an ordinary Qwen3 causal LM, Hugging Face or converted, drafting on its own)."""
    from lightspec_jax.models.config import SUPPORTED_ARCHITECTURES

    if not os.path.isdir(path):
        raise CheckpointError(f"drafter path {path!r} is not a directory")
    config_path = os.path.join(path, "config.json")
    hf = read_json(config_path)
    archs = hf.get("architectures") or []
    eagle3 = LEGACY_ARCHITECTURES + SPECULATORS_ARCHITECTURES
    if any(a in eagle3 for a in archs) or "speculators_model_type" in hf:
        return EAGLE3
    # Checked before DRAFT_LM: DFlash and DSpark config.json files are Qwen3 configs
    # (model_type "qwen3").
    if is_dflash_config(hf):
        return DFLASH
    if is_dspark_config(hf):
        return DSPARK
    if any(a in SUPPORTED_ARCHITECTURES for a in archs) or (
            not archs and hf.get("model_type") == "qwen3"):
        return DRAFT_LM
    raise CheckpointError(
        f"{config_path}: unsupported drafter architecture: architectures={archs!r}, "
        f"model_type={hf.get('model_type')!r}; expected an Eagle3 drafter ({', '.join(eagle3)}), "
        f"a DFlash drafter ({', '.join(DFLASH_ARCHITECTURES)}), a DSpark drafter "
        f"({', '.join(DSPARK_ARCHITECTURES)}) or a Qwen3 draft LM "
        f"({', '.join(SUPPORTED_ARCHITECTURES)})")


def check_same_vocabulary(target_path: str, target_vocab: int, draft_path: str,
                           draft_vocab: int) -> None:
    """A draft LM proposes token ids the target verifies as its own, so both must number the
    same tokens alike: equal vocab_size and, when both ship a tokenizer.json, the same
    token -> id map (another tokenizer would still be lossless, but rarely accepted)."""
    if draft_vocab != target_vocab:
        raise CheckpointError(
            f"draft LM {draft_path} has vocab_size={draft_vocab}, the target {target_path} "
            f"has {target_vocab}: a draft LM must share the target's vocabulary (same tokenizer)")
    paths = [os.path.join(p, "tokenizer.json") for p in (target_path, draft_path)]
    if all(os.path.isfile(p) for p in paths):
        from tokenizers import Tokenizer as HFTokenizer

        target_map, draft_map = (HFTokenizer.from_file(p).get_vocab(with_added_tokens=True)
                                 for p in paths)
        if target_map != draft_map:
            differ = sorted(set(target_map.items()) ^ set(draft_map.items()))
            raise CheckpointError(
                f"the draft LM's tokenizer ({paths[1]}) maps tokens to ids unlike the "
                f"target's ({paths[0]}): {len(differ)} (token, id) pairs differ, e.g. "
                f"{differ[0]!r}; a draft LM must share the target's tokenizer")
