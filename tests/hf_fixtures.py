"""Tiny random Qwen3 checkpoints in real Hugging Face format, written by transformers itself."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TinySpec:
    tied: bool = False
    shard_size: str | None = None  # e.g. "50KB" -> many shards plus an index
    rope_theta: float = 1_000_000.0
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 8  # keeps Eagle3's layers 2, L//2, L-3 distinct (2, 4, 5)
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32  # != hidden/heads on purpose
    seed: int = 0
    eos_token_id: int = 1
    logit_scale: float = 1.0  # > 1 sharpens the output distribution (for sampling tests)


def build_hf_qwen3(directory: str, spec: TinySpec):
    """Saves a random Qwen3ForCausalLM (norm weights perturbed so they matter) to `directory`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen3Config(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, rope_theta=spec.rope_theta, tie_word_embeddings=spec.tied,
        max_position_embeddings=512, eos_token_id=spec.eos_token_id, bos_token_id=None,
        pad_token_id=None, attn_implementation="eager")
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.2 * torch.randn_like(param))
            elif "embed" in name:
                param.mul_(10.0)
            if name == "lm_head.weight":
                param.mul_(spec.logit_scale)
    kwargs = {"max_shard_size": spec.shard_size} if spec.shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return directory, model
