"""Static speculative decoding (MTP=K) vs no speculation on one tiny model pair, this CPU.

Target: a random-weight Qwen3 (hidden 256, 8 layers, 4/2 heads, head_dim 64, intermediate 768,
vocab 8192, tied) in float32. Drafters, each over the same requests:
  eagle3  a random-weight Eagle3 drafter for it - the real architecture, but untrained, so it
          accepts almost nothing (this measures the cost of speculation, not its benefit);
  copy    the target itself as a draft model (corrupt rate 0 or as given) - acceptance near 1,
          an upper bound on what drafting can give at this size, not a real drafter.
Greedy, 48-token prompts, EOS ignored, every output checked equal to plain decoding.

    python benchmarks/spec_static.py --drafter eagle3 --ks 1 3 5 11 --batches 1 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from plain_vs_hf import SHAPE as _PLAIN_SHAPE

# Eagle3 reads layers 2, L//2 and L-3, which must be distinct: 8 layers instead of 4.
SHAPE = {**_PLAIN_SHAPE, "num_layers": 8}


def build_pair(drafter_kind: str, corrupt: float):
    from flax import nnx

    from lightspec_jax.drafters import DraftLMDrafter, Eagle3Drafter
    from lightspec_jax.models import Eagle3, Eagle3Config, Qwen3, Qwen3Config

    target_cfg = Qwen3Config(**SHAPE)
    target = Qwen3(target_cfg, rngs=nnx.Rngs(0))
    if drafter_kind == "eagle3":
        drafter = Eagle3Drafter(Eagle3(Eagle3Config.for_target(target_cfg), rngs=nnx.Rngs(1)))
    else:
        drafter = DraftLMDrafter(Qwen3(target_cfg, rngs=nnx.Rngs(0)), corrupt_rate=corrupt)
    return target, drafter


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", choices=("eagle3", "copy"), default="eagle3")
    parser.add_argument("--corrupt", type=float, default=0.0)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 5, 11])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig

    rng = np.random.default_rng(0)
    rows = []
    for batch in args.batches:
        prompts = [rng.integers(1, SHAPE["vocab_size"], size=args.prompt_len).tolist()
                   for _ in range(batch)]
        params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
        engines = {}
        for k in [0] + args.ks:
            target, drafter = build_pair(args.drafter, args.corrupt)
            spec = (SpeculativeConfig() if k == 0 else
                    SpeculativeConfig(policy="static", num_speculative_tokens=k))
            config = EngineConfig(max_num_seqs=batch, dtype="float32", speculative=spec,
                                  max_model_len=args.prompt_len + args.new_tokens + 1,
                                  max_num_batched_tokens=max(64, batch), show_progress=False)
            engine = Engine(target, config=config, drafter=drafter if k else None)
            engine.generate(prompts, params)  # warm-up
            engines[k] = engine
        times = {k: [] for k in engines}
        outputs = {}
        for _ in range(args.repeats):  # interleaved so every config sees the same noise
            for k, engine in engines.items():
                start = time.perf_counter()
                outputs[k] = engine.generate(prompts, params)
                times[k].append(time.perf_counter() - start)
        base = [o.token_ids for o in outputs[0]]
        for k, engine in engines.items():
            tokens = sum(len(o.token_ids) for o in outputs[k])
            tok_s = tokens / statistics.median(times[k])
            row = dict(batch=batch, k=k, tok_s=tok_s, identical=[o.token_ids for o in outputs[k]] == base,
                       compile_s=engine.compile_seconds)
            if k:
                m = [o.metrics for o in outputs[k]]
                accepted, verified, steps = (sum(x.accepted for x in m), sum(x.verified for x in m),
                                             sum(x.steps for x in m))
                row.update(acceptance_rate=accepted / verified, acceptance_length=1 + accepted / steps)
            rows.append(row)
    print(f"drafter: {args.drafter}" + (f" (corrupt {args.corrupt})" if args.drafter == "copy" else ""))
    print("| batch | policy | tok/s | vs none | acceptance rate | acceptance length | identical | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        none = next(r for r in rows if r["batch"] == row["batch"] and r["k"] == 0)["tok_s"]
        policy = "none" if row["k"] == 0 else f"static K={row['k']}"
        acc = (f"{row['acceptance_rate']:.2f} | {row['acceptance_length']:.2f}" if row["k"]
               else "- | -")
        print(f"| {row['batch']} | {policy} | {row['tok_s']:.0f} | {row['tok_s'] / none:.2f}x | "
              f"{acc} | {row['identical']} | {row['compile_s']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
