"""TRAINING.md: how the shipped pair was made and how good it is, from the work log."""

from __future__ import annotations

import os
import platform


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def write_report(path: str, *, recipe, log: dict, out: str, command: str) -> None:
    import jax

    t, d, q = log.get("target", {}), log.get("drafter", {}), log["eval"]["quality"]
    stage_seconds = {s: log.get(s, {}).get("seconds", 0.0)
                     for s in ("tokenizer", "target", "data", "drafter", "eval")}
    total = sum(stage_seconds.values())
    tm, tr, dr = recipe.target_model, recipe.target, recipe.drafter
    corpus = log.get("tokenizer", {}).get("corpus", {})
    lines = [
        "# The shipped tiny pair: how it was trained",
        "",
        "A tiny Qwen3 target and an Eagle3 drafter trained for it, from scratch, on this machine's",
        "local data only (nothing downloaded). Reproduce with one command:",
        "",
        "```",
        command,
        "```",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores shared with other jobs, "
        f"jax {jax.__version__} (CPU), run under `nice -n 19`.",
        "",
        "## Wall time",
        "",
        "| stage | seconds |",
        "|---|---|",
        *[f"| {s} | {v:.0f} |" for s, v in stage_seconds.items()],
        f"| **total** | **{total:.0f}** ({total / 60:.1f} min) |",
        "",
        "Seconds count training steps (compilation included) and generation; building the",
        "corpus and tokenizing it take a few seconds more per run.",
        "",
        "## Corpus",
        "",
        "| source | documents | characters |",
        "|---|---|---|",
        *[f"| {k} | {v['documents']} | {v['chars']:,} |" for k, v in corpus.items()],
        "",
        f"Byte-level BPE, {recipe.vocab_size} ids, EOS `<|endoftext|>`; "
        f"{log['tokenizer']['train_tokens']:,} training tokens, "
        f"{log['tokenizer']['valid_tokens']:,} held out.",
        "",
        "## Target",
        "",
        f"Qwen3, hidden {tm.hidden_size}, {tm.num_layers} layers, {tm.num_heads}/{tm.num_kv_heads}"
        f" heads, head_dim {tm.head_dim}, intermediate {tm.intermediate_size}, tied embeddings, "
        f"{tm.max_position_embeddings} positions, rope theta {tm.rope_theta:g}.",
        f"{t.get('steps')} steps of AdamW (peak lr {tr.optim.learning_rate:g}, warmup "
        f"{tr.optim.warmup_steps}, cosine), batch {tr.batch_size} x {tr.seq_len} packed tokens.",
        f"Final training loss (mean of the last 20 steps): {t['final']['loss']:.3f}; "
        f"held-out loss of the shipped {recipe.dtype} weights: {t['valid_loss']:.3f}.",
        "",
        "Loss curve (step: mean loss since the previous point): "
        + ", ".join(f"{s}: {v:.2f}" for s, v in t.get("curve", [])),
        "",
        "## Drafter",
        "",
        f"Eagle3 (one decoder layer, legacy EAGLE/SpecForge layout), features from the residual "
        f"stream entering target layers {list(_aux(tm))}; draft vocab "
        f"{d['draft_vocab']['size']} ids (covering {d['draft_vocab']['coverage']:.1%} of the "
        "training tokens) mapped by d2t.",
        f"Trained on {dr.num_sequences} sequences: {dr.prompt_len} corpus tokens continued by "
        f"{dr.gen_len} greedy target tokens; labels are the target's argmax; training-time test "
        f"over {dr.ttt_steps} draft steps (loss weights 0.8^k). {d.get('steps')} steps, batch "
        f"{dr.batch_size}, peak lr {dr.optim.learning_rate:g}.",
        f"Final loss {d['final']['loss']:.3f}; top-1 agreement with the target per draft step: "
        + ", ".join(f"step {k}: {d['final'][f'acc_{k}']:.3f}" for k in range(dr.ttt_steps)),
        "",
        "## Quality",
        "",
        f"{recipe.eval_prompts} prompts per workload (seed 0), {recipe.eval_tokens} greedy tokens"
        f" each with EOS ignored, through `Engine` (float32) with the static policy, "
        f"K={recipe.eval_k}. "
        "distinct-4 is the share of distinct 4-grams per output (1.0: no repetition), averaged;",
        "a looping target drives it towards 0 and its acceptance then measures repetition.",
        "",
        "| workload | prompt tokens (mean) | distinct-4 | acceptance length | acceptance rate |",
        "|---|---|---|---|---|",
        *[f"| {w} | {r['prompt_len']:.0f} | {r['distinct_4']:.3f} | "
          f"{r['acceptance_length']:.2f} | {r['acceptance_rate']:.3f} |" for w, r in q.items()],
        "",
        "Acceptance length = tokens committed per verify step (bonus included, at most K+1);",
        "acceptance rate = accepted / verified draft tokens.",
        "",
        "First 48 generated tokens of the first prompt of each workload:",
        "",
        "```",
        *[f"{w}: {r['sample']!r}" for w, r in q.items()],
        "```",
        "",
        "## Files",
        "",
        f"`target/` {_mb(_size(os.path.join(out, 'target')))} (config.json, "
        f"{recipe.dtype} model.safetensors, tokenizer.json, generation_config.json); "
        f"`drafter/` {_mb(_size(os.path.join(out, 'drafter')))}.",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _aux(cfg) -> tuple[int, ...]:
    return cfg.default_aux_layers


DRAFT_LM_HEADING = "## Draft LM (an assistant for transformers' assisted generation)"


def write_draft_lm_section(path: str, *, recipe, log: dict, draft_dir: str, command: str) -> None:
    """Writes the draft LM's section into TRAINING.md: replaces the section if it is there,
    else goes before `## Files` (or at the end)."""
    d, q = log["draft-lm"], log["draft-eval"]["quality"]
    sh, tr = recipe.shape, recipe.train
    seconds = {s: log.get(s, {}).get("seconds", 0.0) for s in ("draft-data", "draft-lm",
                                                              "draft-eval")}
    curve = ", ".join(f"{s}: {v:.2f}" for s, v in d.get("curve", []))
    section = [
        DRAFT_LM_HEADING,
        "",
        "A small Qwen3 causal LM sharing the target's tokenizer.json, for vanilla speculative",
        "decoding (`Engine.from_pretrained(target, drafter_path=draft-lm)`) and as",
        "`assistant_model=` of transformers, which has no Eagle3 class. Trained for the shipped "
        "target with:",
        "",
        "```",
        command,
        "```",
        "",
        f"Qwen3, hidden {sh.hidden_size}, {sh.num_layers} layers, {sh.num_heads}/"
        f"{sh.num_kv_heads} heads, head_dim {sh.head_dim}, intermediate {sh.intermediate_size}, "
        f"tied embeddings, {d['params']:,} parameters.",
        f"Distilled from the target (sequence-level): {tr.num_sequences} sequences of "
        f"{tr.prompt_len} corpus tokens continued by {tr.gen_len} greedy target tokens (the "
        "Eagle3 drafter's windows), labels = the target's argmax at every position; "
        f"held out: {tr.held_out} of them. {d['steps']} steps of AdamW, batch {tr.batch_size}, "
        f"peak lr {tr.optim.learning_rate:g}, warmup {tr.optim.warmup_steps}, cosine.",
        "",
        *_stage_table(seconds),
        "",
        "draft-data: greedy continuations and the target's labels; draft-lm: training steps "
        "(compilation included); draft-eval: the acceptance table below.",
        "",
        f"Final training loss (mean of the last 20 steps): {d['final']['loss']:.3f}, top-1 "
        f"agreement with the target {d['final']['acc']:.3f}; held out (shipped {recipe.dtype} "
        f"weights): loss {d['held_out']['loss']:.3f}, agreement {d['held_out']['acc']:.3f}.",
        "",
        f"Loss curve (step: mean loss since the previous point): {curve}",
        "",
        *_acceptance_table(recipe, q),
        "",
        f"`draft-lm/` {_mb(_size(draft_dir))} (config.json, {recipe.dtype} model.safetensors, "
        "tokenizer.json, generation_config.json).",
        "",
    ]
    _put_section(path, DRAFT_LM_HEADING, section)


def _stage_table(seconds: dict[str, float]) -> list[str]:
    total = sum(seconds.values())
    return ["| stage | seconds |", "|---|---|",
            *[f"| {s} | {v:.0f} |" for s, v in seconds.items()],
            f"| **total** | **{total:.0f}** ({total / 60:.1f} min) |"]


def _acceptance_table(recipe, quality: dict) -> list[str]:
    return [f"Acceptance through `Engine` (float32, static policy, K={recipe.eval_k}, "
            f"{recipe.eval_prompts} prompts per workload, {recipe.eval_tokens} greedy tokens, "
            "EOS ignored; the protocol of the Quality section):",
            "",
            "| workload | acceptance length | acceptance rate |",
            "|---|---|---|",
            *[f"| {w} | {r['acceptance_length']:.2f} | {r['acceptance_rate']:.3f} |"
              for w, r in quality.items()]]


def _put_section(path: str, heading: str, section: list[str]) -> None:
    """Writes `section` (starting with `heading`) into TRAINING.md: replaces the section if it
    is there, else goes before `## Files` (or at the end)."""
    text = open(path).read() if os.path.isfile(path) else ""
    lines = text.split("\n")
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
    else:
        start = end = lines.index("## Files") if "## Files" in lines else len(lines)
    with open(path, "w") as f:
        f.write("\n".join(lines[:start] + section + lines[end:]))


DFLASH_HEADING = "## DFlash block drafter"


def write_dflash_section(path: str, *, recipe, log: dict, dflash_dir: str, command: str) -> None:
    """Writes the DFlash drafter's section into TRAINING.md (as write_draft_lm_section)."""
    d, q = log["dflash"], log["dflash-eval"]["quality"]
    sh, tr = recipe.shape, recipe.train
    seconds = {s: log.get(s, {}).get("seconds", 0.0) for s in ("draft-data", "dflash",
                                                              "dflash-eval")}
    curve = ", ".join(f"{s}: {v:.2f}" for s, v in d.get("curve", []))
    rows = range(1, sh.block_size)
    section = [
        DFLASH_HEADING,
        "",
        "A DFlash block drafter (z-lab layout: `fc`, `hidden_norm`, `layers.i.*`, `norm`; it reads",
        "blocks out through the target's embedding and head): one forward drafts a whole block.",
        "Trained for the shipped target with:",
        "",
        "```",
        command,
        "```",
        "",
        f"{sh.num_layers} Qwen3 draft layers of the target's widths, block {sh.block_size} (the "
        f"bonus token + {sh.block_size - 1} drafts), features: the outputs of target layers "
        f"{list(sh.target_layer_ids)}, mask token = the last vocabulary id; "
        f"{d['params']:,} parameters.",
        f"Distilled from the target on the draft LM's greedy data ({tr.num_sequences} sequences, "
        f"held out: {tr.held_out}): each step drafts {tr.anchors} blocks per sequence at random "
        f"anchors; block row i learns the target's argmax at its position, weighted "
        f"{tr.row_decay:g}^(i-1). {d['steps']} steps of AdamW, batch {tr.batch_size}, peak lr "
        f"{tr.optim.learning_rate:g}, warmup {tr.optim.warmup_steps}, cosine.",
        "",
        *_stage_table(seconds),
        "",
        f"Final training loss (mean of the last 20 steps): {d['final']['loss']:.3f}, tau "
        f"{d['final']['tau']:.2f}; held out (shipped {recipe.dtype} weights, seeded anchors): "
        f"loss {d['held_out']['loss']:.3f}, tau {d['held_out']['tau']:.2f} (tau: the mean "
        "acceptance length of a greedy verify of the whole block, bonus included).",
        "Held-out top-1 agreement per block row: "
        + ", ".join(f"{i}: {d['held_out'][f'acc_{i}']:.3f}" for i in rows),
        "",
        f"Loss curve (step: mean loss since the previous point): {curve}",
        "",
        *_acceptance_table(recipe, q),
        "",
        f"`dflash/` {_mb(_size(dflash_dir))} (config.json, {recipe.dtype} model.safetensors).",
        "",
    ]
    _put_section(path, DFLASH_HEADING, section)
