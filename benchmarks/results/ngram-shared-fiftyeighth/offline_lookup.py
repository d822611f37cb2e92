"""Offline: how many tokens a step n-gram proposals would commit on a workload, looked up in
each request's own tokens alone, or in other requests' tokens as well (the shipped pair's
greedy outputs, replayed in Python; no engine timing).

    python benchmarks/results/ngram-shared-fiftyeighth/offline_lookup.py math sharegpt

Each request's greedy output (plain decoding, 64 prompts, max_tokens 64) is replayed step by
step: the proposal is what followed the latest earlier occurrence of the last n tokens
(n = 3, 2, 1, longest first), `depth` tokens at most; a step commits the proposal's prefix
that equals the output, plus one token. Sources, tried in this order at each n:
  own             the request's prompt and its output so far
  peers           ... then the other requests of its wave of 16 (requests i // 16 alike):
                  their prompts and outputs up to the same step
  peers+finished  ... then every earlier wave's prompts and whole outputs
"""

import os
import sys

from lightspec_jax import Engine, EngineConfig
from lightspec_jax.assets import tiny_pair
from lightspec_jax.bench.workloads import load_workload, workload_requests
from lightspec_jax.tokenizer import Tokenizer

WAVE = 16


def propose(history, depth, others):
    for n in (3, 2, 1):
        if len(history) <= n:
            continue
        suffix = history[-n:]
        for source in [history] + others:
            for p in range(len(source) - n - 1, -1, -1):  # latest first; a token follows
                if source[p:p + n] == suffix:
                    return source[p + n:p + n + depth]
    return []


def tokens_per_step(prompts, outputs, depth, mode):
    steps = tokens = 0
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        wave = i // WAVE
        t = 0
        while t < len(out):
            history = list(prompt) + list(out[:t])
            others = []
            if mode != "own":
                others += [list(prompts[j]) + list(outputs[j][:t])
                           for j in range(wave * WAVE, min(len(prompts), wave * WAVE + WAVE))
                           if j != i]
            if mode == "peers+finished":
                others += [list(prompts[j]) + list(outputs[j]) for j in range(wave * WAVE)]
            proposal = propose(history, depth, others)
            accepted = 0
            for k, x in enumerate(proposal):
                if t + k < len(out) and out[t + k] == x:
                    accepted += 1
                else:
                    break
            step = min(1 + accepted, len(out) - t)
            t += step
            steps += 1
            tokens += step
    return tokens / steps


def main():
    pair = tiny_pair()
    tok = Tokenizer.from_file(os.path.join(pair.target, "tokenizer.json"))
    engine = Engine.from_pretrained(pair.target, None, config=EngineConfig(
        max_num_seqs=16, max_model_len=512, show_progress=False))
    for workload in sys.argv[1:] or ["math"]:
        items = load_workload(workload, tok, 64, seed=0, max_prompt_len=256)
        prompts, params = workload_requests(items, max_tokens=64)
        outputs = [o.token_ids for o in engine.generate(prompts, params)]
        for depth in (1, 3):
            row = {mode: round(tokens_per_step(prompts, outputs, depth, mode), 3)
                   for mode in ("own", "peers", "peers+finished")}
            print(f"{workload} depth {depth}: tokens a step {row}")


if __name__ == "__main__":
    main()
