"""`lightspec-demo`: generate with the engine from a small checkpoint, end to end on this CPU.

Without --target it writes a tiny random-weight Qwen3 in Hugging Face format (our own exporter;
nothing is downloaded) and serves it, so the whole path - HF loading, bucket compilation,
continuous batching, sampling - runs on a fresh machine. Random weights produce meaningless
tokens; the point is the machinery and its speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

DEMO_CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4,
                   num_heads=4, num_kv_heads=2, head_dim=64, tie_word_embeddings=True,
                   max_position_embeddings=2048, eos_token_ids=(0,))


def build_demo_checkpoint(directory: str, seed: int = 0) -> str:
    """A random tiny Qwen3 written as a Hugging Face directory (once; reused afterwards)."""
    from flax import nnx

    from lightspec_jax.checkpoint import save_qwen3_hf
    from lightspec_jax.models import Qwen3, Qwen3Config

    if not os.path.isfile(os.path.join(directory, "config.json")):
        model = Qwen3(Qwen3Config(**DEMO_CONFIG), rngs=nnx.Rngs(seed))
        save_qwen3_hf(model, directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lightspec-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="Qwen3 checkpoint (HF or converted directory); "
                                         "default: a tiny random model built on the fly")
    parser.add_argument("--workdir", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                          "lightspec_jax", "demo-tiny-qwen3"))
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args(argv)

    from lightspec_jax import Engine, EngineConfig, SamplingParams

    target = args.target or build_demo_checkpoint(args.workdir)
    config = EngineConfig(max_num_seqs=args.max_num_seqs, dtype=args.dtype,
                          max_model_len=args.prompt_len + args.max_tokens + 1,
                          max_num_batched_tokens=max(256, args.max_num_seqs))
    engine = Engine.from_pretrained(target, config=config)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, engine.vocab_size, size=args.prompt_len).tolist()
               for _ in range(args.num_prompts)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=0)
    engine.generate(prompts[:2], params)  # warm the dispatch path
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.token_ids) for o in outs)
    print(f"target: {target}{'  (random weights)' if args.target is None else ''}")
    print(f"{len(outs)} requests, concurrency {args.max_num_seqs}: {generated} tokens in "
          f"{elapsed:.2f} s = {generated / elapsed:.1f} tok/s (prefill included)")
    print(f"first output: {outs[0].text if outs[0].text is not None else outs[0].token_ids[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
