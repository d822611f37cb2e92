"""Batch-1 speculative decoding: transformers assisted generation vs this engine, shipped tiny pair.

Methods (greedy, float32 on both sides, batch 1, one prompt at a time, EOS ignored so every
output has --max-tokens tokens):

  hf                     transformers target alone, generate(do_sample=False)
  hf-assisted-k3         assisted generation, assistant_model= the draft LM, constant 3 tokens
                         (assistant_confidence_threshold=0, so exactly 3 are drafted)
  hf-assisted-heuristic  the same, heuristic schedule from 5 tokens (+2 after a fully accepted
                         draft, -1 otherwise; the 4.x default), reset before every prompt
  hf-assisted-default    the same with transformers 5.24's defaults: 20 tokens, constant, drafting
                         stops below confidence 0.4 (the threshold adapts only with scikit-learn)
  ours-none              Engine, no drafter
  ours-draft-lm-k3       Engine, static K=3, the same draft LM (drafter_path=draft-lm)
  ours-eagle3-k3         Engine, static K=3, the shipped Eagle3 drafter
  ours-eagle3-dynamic    Engine, dynamic (LightSpec) policy, K <= --dynamic-k, Eagle3

transformers reads the number of assistant tokens, the schedule and the confidence threshold
from the assistant's generation_config, not from generate()'s arguments
(reference/hf-baseline.md), so they are set there before each call.

Fairness as in benchmarks/plain_vs_hf.py: transformers on --torch-threads (1: two were no
faster, reference/hf-baseline.md) with eager attention, our engines on XLA:CPU; each method
is warmed up on the workload's first prompt (excluded), then the methods run in a rotating
order in every repeat (interleaved: all see the same machine noise) and the median is
reported. Our time is whole Engine.generate calls (prefill, scheduling, host bookkeeping);
start-up compilation and the dynamic policy's cost sweep are excluded. Every method's token ids
are checked against the transformers target alone.

Acceptance: ours from RequestOutput.metrics; transformers' from its assisted loop, which
reports each verification to the candidate generator's update_candidate_strategy (counted
here by wrapping that method). Acceptance length = 1 + accepted / verify steps; acceptance
rate = accepted / verified draft tokens.

    python benchmarks/assisted_vs_hf.py --out assisted_vs_hf.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable, NamedTuple

HF_METHODS = ("hf", "hf-assisted-k3", "hf-assisted-heuristic", "hf-assisted-default")
OUR_METHODS = ("ours-none", "ours-draft-lm-k3", "ours-eagle3-k3", "ours-eagle3-dynamic")
METHODS = HF_METHODS + OUR_METHODS
REFERENCE = "hf"
# Assistant generation_config settings per assisted method. Threshold 0 turns the confidence
# stop off (transformers only applies it when > 0).
ASSISTANT_SETTINGS = {
    "hf-assisted-k3": dict(num_assistant_tokens=3, num_assistant_tokens_schedule="constant",
                           assistant_confidence_threshold=0.0),
    "hf-assisted-heuristic": dict(num_assistant_tokens=5, num_assistant_tokens_schedule="heuristic",
                                  assistant_confidence_threshold=0.0),
    "hf-assisted-default": dict(num_assistant_tokens=20, num_assistant_tokens_schedule="constant",
                                assistant_confidence_threshold=0.4),
}


class Counts(NamedTuple):
    steps: int  # verify steps
    verified: int  # draft tokens verified
    accepted: int  # draft tokens accepted


Run = Callable[[list[int]], tuple[list[int], Counts | None]]


def default_pair_dir() -> str:
    import lightspec_jax
    return os.path.join(os.path.dirname(lightspec_jax.__file__), "assets", "tiny-pair")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default=None, help="directory with target/, drafter/ (Eagle3) and "
                                                "draft-lm/ (default: the shipped tiny pair)")
    p.add_argument("--workloads", nargs="+", default=["sharegpt", "humaneval", "math"])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                   metavar="METHOD", help=f"a subset of {', '.join(METHODS)} (default: all); "
                                          f"{REFERENCE!r}, the reference, always runs")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts per workload")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument("--seed", type=int, default=0, help="workload sampling seed")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dynamic-k", type=int, default=5, help="the dynamic policy's maximum depth")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="our engines' max_num_batched_tokens (default: the target's "
                        "max_position_embeddings, so a prompt is prefilled in one chunk as "
                        "transformers does); smaller compiles fewer buckets")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    if REFERENCE not in args.methods:
        args.methods.insert(0, REFERENCE)
    args.methods = [m for m in METHODS if m in args.methods]
    args.pair = args.pair or default_pair_dir()
    return args


# --- transformers ---------------------------------------------------------------------------

class AssistedCounter:
    """Counts transformers' assisted-generation verifications.

    transformers 5.24 (`generation/utils.py`, `_assisted_decoding`) calls
    candidate_generator.update_candidate_strategy(input_ids, scores, num_matches) once per
    verification, scores [1, candidates + 1, V] holding the bonus row too; the wrapper counts
    and then calls the original.
    """

    def __init__(self):
        self.steps = self.verified = self.accepted = 0

    def __enter__(self) -> "AssistedCounter":
        from transformers.generation.candidate_generator import AssistedCandidateGenerator

        self._original = original = AssistedCandidateGenerator.update_candidate_strategy
        counter = self

        def update(generator, input_ids, scores, num_matches):
            counter.steps += 1
            counter.verified += scores.shape[1] - 1
            counter.accepted += int(num_matches)
            return original(generator, input_ids, scores, num_matches)

        AssistedCandidateGenerator.update_candidate_strategy = update
        return self

    def __exit__(self, *exc) -> None:
        from transformers.generation.candidate_generator import AssistedCandidateGenerator

        AssistedCandidateGenerator.update_candidate_strategy = self._original

    def take(self) -> Counts:
        counts = Counts(self.steps, self.verified, self.accepted)
        self.steps = self.verified = self.accepted = 0
        return counts


def hf_runner(target, max_tokens: int, *, assistant=None, settings=None,
              counter: AssistedCounter | None = None) -> Run:
    import torch

    def run(prompt):
        kwargs = {}
        if assistant is not None:
            for key, value in settings.items():  # also undoes the heuristic's write-back
                setattr(assistant.generation_config, key, value)
            kwargs["assistant_model"] = assistant
            counter.take()
        with torch.no_grad():
            out = target.generate(torch.tensor([prompt]), max_new_tokens=max_tokens,
                                  do_sample=False, eos_token_id=None, pad_token_id=0, **kwargs)
        return out[0, len(prompt):].tolist(), (counter.take() if assistant is not None else None)

    return run


# --- ours -----------------------------------------------------------------------------------

def engine_runner(engine, max_tokens: int) -> Run:
    from lightspec_jax import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)

    def run(prompt):
        out, = engine.generate([prompt], params)
        m = out.metrics
        return out.token_ids, None if m is None else Counts(m.steps, m.verified, m.accepted)

    return run


def build_runners(args, max_model_len: int, counter: AssistedCounter) -> dict[str, Run]:
    import torch
    from transformers import AutoModelForCausalLM

    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig

    target_dir = os.path.join(args.pair, "target")
    paths = {"draft-lm": os.path.join(args.pair, "draft-lm"),
             "eagle3": os.path.join(args.pair, "drafter")}

    def hf_model(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                    attn_implementation="eager").eval()

    runners: dict[str, Run] = {}
    hf_target = hf_model(target_dir)
    runners["hf"] = hf_runner(hf_target, args.max_tokens)
    assisted = [m for m in args.methods if m in ASSISTANT_SETTINGS]
    if assisted:
        assistant = hf_model(paths["draft-lm"])
        for name in assisted:
            runners[name] = hf_runner(hf_target, args.max_tokens, assistant=assistant,
                                      settings=ASSISTANT_SETTINGS[name], counter=counter)

    def engine(drafter, policy, k):
        spec = SpeculativeConfig() if policy == "none" else SpeculativeConfig(
            policy=policy, num_speculative_tokens=k)
        config = EngineConfig(max_num_seqs=1, max_model_len=max_model_len, dtype="float32",
                              max_num_batched_tokens=args.prefill_chunk or max_model_len,
                              show_progress=False,
                              speculative=spec)
        return Engine.from_pretrained(target_dir, drafter and paths[drafter], config=config)

    ours = {"ours-none": (None, "none", 0), "ours-draft-lm-k3": ("draft-lm", "static", 3),
            "ours-eagle3-k3": ("eagle3", "static", 3),
            "ours-eagle3-dynamic": ("eagle3", "dynamic", args.dynamic_k)}
    for name in args.methods:
        if name in ours:
            start = time.perf_counter()
            runners[name] = engine_runner(engine(*ours[name]), args.max_tokens)
            print(f"{name}: engine ready in {time.perf_counter() - start:.1f} s", flush=True)
    return runners


# --- the measurement ------------------------------------------------------------------------

def measure(runners: dict[str, Run], prompts: list[list[int]], repeats: int) -> dict:
    """Per method: tok/s per repeat, outputs and counts of the first repeat, output checks."""
    names = list(runners)
    for name in names:  # warm-up, excluded
        runners[name](prompts[0])
    seconds = {name: [] for name in names}
    outputs, counts = {}, {}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotating order
            start = time.perf_counter()
            results = [runners[name](p) for p in prompts]
            seconds[name].append(time.perf_counter() - start)
            tokens = [t for t, _ in results]
            if name in outputs and outputs[name] != tokens:
                raise RuntimeError(f"{name}: outputs differ between repeats (not deterministic)")
            outputs[name] = tokens
            counts[name] = [c for _, c in results]
    ref = outputs[REFERENCE]
    rows = {}
    for name in names:
        num_tokens = sum(map(len, outputs[name]))
        tok_s = [num_tokens / s for s in seconds[name]]
        mismatched = [i for i, (a, b) in enumerate(zip(outputs[name], ref)) if a != b]
        row = dict(tok_s=statistics.median(tok_s), tok_s_repeats=tok_s, tokens=num_tokens,
                   identical=not mismatched, mismatched_prompts=mismatched,
                   first_mismatch=[_first_difference(outputs[name][i], ref[i])
                                   for i in mismatched])
        if all(c is not None for c in counts[name]):
            steps, verified, accepted = (sum(c[j] for c in counts[name]) for j in range(3))
            row.update(verify_steps=steps, verified=verified, accepted=accepted,
                       acceptance_length=1.0 + accepted / max(steps, 1),
                       acceptance_rate=accepted / max(verified, 1))
        rows[name] = row
    for row in rows.values():
        row["speedup"] = row["tok_s"] / rows[REFERENCE]["tok_s"]
    return rows


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def markdown(results: dict) -> str:
    lines = ["| workload | method | tok/s | vs hf | acceptance length | acceptance rate | "
             "identical to hf |", "|---|---|---|---|---|---|---|"]
    for workload, w in results["workloads"].items():
        for name, r in w["methods"].items():
            acc = (f"{r['acceptance_length']:.2f} | {r['acceptance_rate']:.3f}"
                   if "acceptance_length" in r else "- | -")
            same = "yes" if r["identical"] else f"no ({len(r['mismatched_prompts'])} prompts)"
            lines.append(f"| {workload} | {name} | {r['tok_s']:.0f} | {r['speedup']:.2f}x | "
                         f"{acc} | {same} |")
    return "\n".join(lines)


def run_all(args, runners: dict[str, Run], tokenizer, max_prompt_len: int) -> dict:
    import torch
    import transformers

    from lightspec_jax.bench.workloads import load_workload

    # Paths stay out of the results: they name this machine's directories.
    results = {"settings": {**{k: v for k, v in vars(args).items() if k not in ("pair", "out")},
                            "max_prompt_len": max_prompt_len,
                            "transformers": transformers.__version__,
                            "torch": torch.__version__,
                            "assistant_settings": {m: ASSISTANT_SETTINGS[m] for m in args.methods
                                                   if m in ASSISTANT_SETTINGS}},
               "workloads": {}}
    for workload in args.workloads:
        items = load_workload(workload, tokenizer, args.num_prompts, args.seed,
                              max_prompt_len=max_prompt_len)
        prompts = [item.prompt_token_ids for item in items]
        start = time.perf_counter()
        results["workloads"][workload] = {
            "prompt_tokens_mean": statistics.mean(map(len, prompts)),
            "methods": measure(runners, prompts, args.repeats)}
        print(f"{workload}: {len(prompts)} prompts (mean {statistics.mean(map(len, prompts)):.0f} "
              f"tokens) measured in {time.perf_counter() - start:.0f} s", flush=True)
    return results


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from lightspec_jax.checkpoint.qwen3 import read_qwen3_config
    from lightspec_jax.tokenizer import Tokenizer

    torch.set_num_threads(args.torch_threads)
    target_dir = os.path.join(args.pair, "target")
    max_model_len = read_qwen3_config(target_dir).max_position_embeddings
    # Room for the output plus a margin: no method writes a position past the target's
    # max_position_embeddings.
    max_prompt_len = max_model_len - args.max_tokens - 16
    tokenizer = Tokenizer.from_file(os.path.join(target_dir, "tokenizer.json"))
    with AssistedCounter() as counter:
        results = run_all(args, build_runners(args, max_model_len, counter), tokenizer,
                          max_prompt_len)
    print(markdown(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
