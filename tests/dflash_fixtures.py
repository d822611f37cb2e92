"""Tiny DFlash drafters written key by key in the z-lab Hugging Face layout (config.json with
`dflash_config`, unprefixed tensors, torch [out, in] layouts), independent of our saver."""

from __future__ import annotations

import json
import os

import numpy as np


def zlab_tensors(*, hidden, intermediate, heads, kv_heads, head_dim, num_layers, num_features,
                 seed=0):
    """name -> float32 array, weights of a realistic scale, norms away from 1 so they matter."""
    rng = np.random.default_rng(seed)

    def lin(out, inp):
        return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    tensors = {"fc.weight": lin(hidden, num_features * hidden),
               "hidden_norm.weight": norm(hidden), "norm.weight": norm(hidden)}
    for i in range(num_layers):
        p = f"layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": lin(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": lin(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": lin(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": lin(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": norm(head_dim),
            p + "self_attn.k_norm.weight": norm(head_dim),
            p + "mlp.gate_proj.weight": lin(intermediate, hidden),
            p + "mlp.up_proj.weight": lin(intermediate, hidden),
            p + "mlp.down_proj.weight": lin(hidden, intermediate),
            p + "input_layernorm.weight": norm(hidden),
            p + "post_attention_layernorm.weight": norm(hidden),
        })
    return tensors


def write_zlab_dflash(directory, *, target_layers, vocab_size, hidden=64, intermediate=96,
                      heads=4, kv_heads=2, head_dim=32, num_layers=2, block_size=6,
                      mask_token_id=None, target_layer_ids=None, rope_theta=50_000.0,
                      dtype="float32", shard=False, extra=None, seed=0):
    """Writes a DFlash checkpoint; returns its float32 tensors (before any bf16 rounding).

    target_layer_ids=None leaves them out of config.json (the class default applies);
    `extra` adds tensors (e.g. an lm_head copy some exports carry)."""
    num_features = len(target_layer_ids) if target_layer_ids is not None else num_layers
    tensors = zlab_tensors(hidden=hidden, intermediate=intermediate, heads=heads,
                           kv_heads=kv_heads, head_dim=head_dim, num_layers=num_layers,
                           num_features=num_features, seed=seed)
    save_tensors(directory, dict(tensors, **(extra or {})), num_layers=num_layers, dtype=dtype,
                 shard=shard)
    dflash = {"mask_token_id": vocab_size - 1 if mask_token_id is None else mask_token_id}
    if target_layer_ids is not None:
        dflash["target_layer_ids"] = list(target_layer_ids)
    write_config(directory, {
        **body_config(hidden=hidden, intermediate=intermediate, heads=heads, kv_heads=kv_heads,
                      head_dim=head_dim, num_layers=num_layers, vocab_size=vocab_size,
                      rope_theta=rope_theta, target_layers=target_layers,
                      block_size=block_size, dtype=dtype),
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "dflash_config": dflash})
    return tensors


def body_config(*, hidden, intermediate, heads, kv_heads, head_dim, num_layers, vocab_size,
                rope_theta, target_layers, block_size, dtype):
    """The Qwen3 fields a block drafter's config.json carries (DFlash and DSpark alike)."""
    return {
        "model_type": "qwen3", "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": num_layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab_size,
        "rms_norm_eps": 1e-6, "rope_theta": rope_theta, "rope_scaling": None,
        "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
        "max_position_embeddings": 512, "num_target_layers": target_layers,
        "block_size": block_size, "torch_dtype": dtype,
    }


def write_config(directory, config):
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def save_tensors(directory, stored, *, num_layers, dtype, shard):
    """model.safetensors, or (shard) one file per layer plus one for the rest, routed by the
    index; dtype "bfloat16" rounds every tensor."""
    from safetensors.numpy import save_file

    if dtype == "bfloat16":
        import ml_dtypes
        stored = {k: v.astype(ml_dtypes.bfloat16) for k, v in stored.items()}
    os.makedirs(directory, exist_ok=True)
    if shard:
        files = {k: (f"model-0000{int(k.split('.')[1]) + 1}-of-0000{num_layers + 1}.safetensors"
                     if k.startswith("layers.") else
                     f"model-0000{num_layers + 1}-of-0000{num_layers + 1}.safetensors")
                 for k in stored}
        for name in set(files.values()):
            save_file({k: v for k, v in stored.items() if files[k] == name},
                      os.path.join(directory, name), metadata={"format": "pt"})
        with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": files}, f)
    else:
        save_file(stored, os.path.join(directory, "model.safetensors"),
                  metadata={"format": "pt"})


def edit_config(path, fn):
    """Applies fn to the config.json of the checkpoint directory `path` (a pathlib.Path)."""
    config = json.loads((path / "config.json").read_text())
    fn(config)
    (path / "config.json").write_text(json.dumps(config))


def edit_tensors(path, fn):
    """Applies fn to the tensors of `path`'s single-file model.safetensors."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
