"""Quality numbers of a trained pair: does the target loop, and how often is the drafter right.

A tiny target that falls into loops makes acceptance measure repetition, not language
(reference/hf-baseline.md), so every acceptance figure is reported beside the distinct-4-gram
ratio of the same greedy outputs. Acceptance is measured through the public Engine with the
static policy (draft K, verify all), greedy, fixed output length (ignore EOS) as in the
benchmark protocol.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from lightspec_jax.bench.workloads import WORKLOADS, load_workload


def distinct_ngram_ratio(tokens: Sequence[int], n: int = 4) -> float:
    """Distinct n-grams / n-grams of one output (1.0: no n-gram repeats; a loop drives it to 0)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def evaluate_pair(target_dir: str, drafter_dir: str, *, num_prompts: int = 20,
                  max_tokens: int = 128, num_speculative_tokens: int = 3, seed: int = 0,
                  workloads: Sequence[str] = WORKLOADS, max_model_len: int | None = None,
                  progress: bool = False) -> dict[str, dict[str, float]]:
    """Per workload: distinct_4 (mean over outputs), acceptance_length (tokens committed per
    verify step, bonus included), acceptance_rate (accepted / verified drafts), prompt_len."""
    from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
    from lightspec_jax.checkpoint.qwen3 import read_qwen3_config
    from lightspec_jax.tokenizer import Tokenizer

    cfg = read_qwen3_config(target_dir)
    max_model_len = max_model_len or cfg.max_position_embeddings
    k = num_speculative_tokens
    max_prompt_len = max_model_len - max_tokens - 2 * k - 1
    if max_prompt_len < 8:
        raise ValueError(f"max_model_len={max_model_len} leaves no room for prompts after "
                         f"{max_tokens} output tokens")
    tokenizer = Tokenizer.from_file(os.path.join(target_dir, "tokenizer.json"))
    engine = Engine.from_pretrained(target_dir, drafter_dir, config=EngineConfig(
        max_num_seqs=num_prompts, max_model_len=max_model_len, dtype="float32",
        max_num_batched_tokens=max(256, num_prompts), show_progress=progress,
        # one batch per workload, untimed: the buckets it never reaches need no compile
        compile_on_first_use=True,
        speculative=SpeculativeConfig(policy="static", num_speculative_tokens=k)))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    results = {}
    for name in workloads:
        items = load_workload(name, tokenizer, num_prompts, seed, max_prompt_len=max_prompt_len)
        outs = engine.generate([item.prompt_token_ids for item in items], params)
        steps = sum(o.metrics.steps for o in outs)
        accepted = sum(o.metrics.accepted for o in outs)
        verified = sum(o.metrics.verified for o in outs)
        results[name] = {
            "distinct_4": float(np.mean([distinct_ngram_ratio(o.token_ids) for o in outs])),
            "acceptance_length": 1.0 + accepted / max(steps, 1),
            "acceptance_rate": accepted / max(verified, 1),
            "prompt_len": float(np.mean([len(item.prompt_token_ids) for item in items])),
            "sample": tokenizer.decode(outs[0].token_ids[:48]),
        }
    return results
