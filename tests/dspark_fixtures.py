"""Tiny DSpark drafters written key by key in the DeepSpec Hugging Face layout (config.json as
`deepspec/modeling/dspark/qwen3/config.py` builds it, unprefixed tensors, torch [out, in]
layouts), independent of our saver."""

from __future__ import annotations

import numpy as np

from dflash_fixtures import body_config, save_tensors, write_config, zlab_tensors


def write_deepspec_dspark(directory, *, target_layers, vocab_size, target_layer_ids,
                          hidden=64, intermediate=96, heads=4, kv_heads=2, head_dim=32,
                          num_layers=2, block_size=4, mask_token_id=None, markov_rank=8,
                          confidence=True, with_markov=True, rope_theta=50_000.0,
                          dtype="float32", shard=False, extra=None, seed=0):
    """Writes a DSpark checkpoint; returns its float32 tensors (before any bf16 rounding).
    markov_rank=0: no Markov head; confidence=False: no confidence head; `extra` adds
    tensors (e.g. the embed_tokens / lm_head copies DeepSpec saves)."""
    tensors = zlab_tensors(hidden=hidden, intermediate=intermediate, heads=heads,
                           kv_heads=kv_heads, head_dim=head_dim, num_layers=num_layers,
                           num_features=len(target_layer_ids), seed=seed)
    rng = np.random.default_rng(seed + 1000)
    if markov_rank:
        tensors["markov_head.markov_w1.weight"] = rng.standard_normal(
            (vocab_size, markov_rank)).astype(np.float32)  # nn.Embedding [V, r]
        tensors["markov_head.markov_w2.weight"] = (rng.standard_normal(
            (vocab_size, markov_rank)) / np.sqrt(markov_rank)).astype(np.float32)  # [V, r]
    if confidence:
        features = hidden + (markov_rank if with_markov else 0)
        tensors["confidence_head.proj.weight"] = (rng.standard_normal((1, features))
                                                  / np.sqrt(features)).astype(np.float32)
        tensors["confidence_head.proj.bias"] = np.asarray([0.3], np.float32)
    save_tensors(directory, dict(tensors, **(extra or {})), num_layers=num_layers, dtype=dtype,
                 shard=shard)
    config = {
        **body_config(hidden=hidden, intermediate=intermediate, heads=heads, kv_heads=kv_heads,
                      head_dim=head_dim, num_layers=num_layers, vocab_size=vocab_size,
                      rope_theta=rope_theta, target_layers=target_layers,
                      block_size=block_size, dtype=dtype),
        "architectures": ["Qwen3DSparkModel"], "layer_types": ["full_attention"] * num_layers,
        "mask_token_id": vocab_size - 1 if mask_token_id is None else mask_token_id,
        "target_layer_ids": list(target_layer_ids), "num_anchors": 512,
        "markov_rank": markov_rank, "enable_confidence_head": confidence,
    }
    if markov_rank:
        config["markov_head_type"] = "vanilla"
    if confidence:
        config["confidence_head_with_markov"] = with_markov
    write_config(directory, config)
    return tensors
