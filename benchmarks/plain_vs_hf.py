"""Plain decode throughput: lightspec_jax Engine vs transformers `generate`, same tiny model.

Both run the same random-weight Qwen3 (the shape of reference/hf-baseline.md: hidden 256,
4 layers, 4/2 heads, head_dim 64, intermediate 768, vocab 8192, tied) in float32 on this CPU,
greedy, prompts of 48 tokens, 128 new tokens, EOS ignored; batch 1 and batch 16, interleaved
repeats, median reported. Usage:

    python benchmarks/plain_vs_hf.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np

SHAPE = dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4,
             num_kv_heads=2, head_dim=64, tie_word_embeddings=True, max_position_embeddings=2048)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    import torch
    from flax import nnx
    from transformers import Qwen3ForCausalLM

    from lightspec_jax import Engine, EngineConfig, SamplingParams
    from lightspec_jax.checkpoint import save_qwen3_hf
    from lightspec_jax.models import Qwen3, Qwen3Config

    torch.set_num_threads(args.torch_threads)
    directory = tempfile.mkdtemp(prefix="plain-bench-")
    save_qwen3_hf(Qwen3(Qwen3Config(**SHAPE), rngs=nnx.Rngs(0)), directory)
    hf = Qwen3ForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    rng = np.random.default_rng(0)
    results = {}
    for batch in (1, 16):
        prompts = [rng.integers(1, SHAPE["vocab_size"], size=args.prompt_len).tolist()
                   for _ in range(batch)]
        engine = Engine.from_pretrained(directory, config=EngineConfig(
            max_num_seqs=batch, max_model_len=args.prompt_len + args.new_tokens + 1,
            dtype="float32", max_num_batched_tokens=max(64, batch), show_progress=False))
        params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
        engine.generate(prompts, params)  # warm-up
        with torch.no_grad():
            hf.generate(torch.tensor(prompts), max_new_tokens=8, do_sample=False, pad_token_id=0)
        ours, theirs = [], []
        for _ in range(args.repeats):  # interleaved: both see the same machine noise
            start = time.perf_counter()
            outs = engine.generate(prompts, params)
            ours.append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
            start = time.perf_counter()
            with torch.no_grad():
                ref = hf.generate(torch.tensor(prompts), max_new_tokens=args.new_tokens,
                                  do_sample=False, pad_token_id=0)
            theirs.append(batch * args.new_tokens / (time.perf_counter() - start))
        same = all(o.token_ids == ref[i, args.prompt_len:].tolist() for i, o in enumerate(outs))
        results[batch] = dict(lightspec_tok_s=statistics.median(ours),
                              transformers_tok_s=statistics.median(theirs),
                              ratio=statistics.median(ours) / statistics.median(theirs),
                              identical_greedy_output=same)
    print("| batch | lightspec_jax tok/s | transformers tok/s | ratio | identical output |")
    print("|---|---|---|---|---|")
    for batch, r in results.items():
        print(f"| {batch} | {r['lightspec_tok_s']:.0f} | {r['transformers_tok_s']:.0f} | "
              f"{r['ratio']:.1f}x | {r['identical_greedy_output']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
