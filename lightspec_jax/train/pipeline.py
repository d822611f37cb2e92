"""From nothing to a shipped target + drafter pair, in resumable stages.

    tokenizer -> target -> greedy data -> drafter -> quality report (TRAINING.md)

and, for a pair already trained, a standalone draft LM (`build_draft_lm`) or a DFlash block
drafter (`build_dflash`), both distilled on the same greedy data:

    greedy data + target labels -> draft LM | DFlash -> quality (a section of TRAINING.md)

Stage outputs and resumable optimiser checkpoints live in a work directory; a stage whose
output is there is skipped, so an interrupted run picks up where it stopped. Only `target/`,
`drafter/`, `draft-lm/`, `dflash/` and TRAINING.md go to the output directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lightspec_jax.models import DFlash, Qwen3, Qwen3Config

from .corpus import CorpusConfig, build_corpus
from .data import TokenStream
from .dflash import DFlashShape, DFlashTrainConfig
from .draft_lm import (DraftLMShape, DraftLMTrainConfig, agreement, distill_labels,
                       train_draft_lm)
from .eagle3 import Eagle3TrainConfig, build_sequences, new_drafter, select_draft_vocab, train_eagle3
from .loop import TrainLog
from .target import TargetTrainConfig, train_target, validation_loss
from .tokenizer import eos_id, train_tokenizer

STAGES = ("tokenizer", "target", "data", "drafter", "eval")
DRAFT_LM_STAGES = ("draft-data", "draft-lm", "draft-eval")
DRAFT_LM_DIR = "draft-lm"
DFLASH_STAGES = ("draft-data", "dflash", "dflash-eval")
DFLASH_DIR = "dflash"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PairRecipe:
    corpus: CorpusConfig
    vocab_size: int
    target_model: Qwen3Config  # vocab_size and eos are filled in once the tokenizer exists
    target: TargetTrainConfig
    drafter: Eagle3TrainConfig
    dtype: str = "bfloat16"  # of the shipped weights
    eval_prompts: int = 20
    eval_tokens: int = 128
    eval_k: int = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftLMRecipe:
    corpus: CorpusConfig  # the pair's: its windows are the prompts of the greedy data
    shape: DraftLMShape = DraftLMShape()
    train: DraftLMTrainConfig
    dtype: str = "bfloat16"  # of the shipped weights
    eval_prompts: int = 20
    eval_tokens: int = 128
    eval_k: int = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class DFlashRecipe(DraftLMRecipe):
    """A DFlash block drafter distilled on the draft LM's greedy data (same corpus fields)."""

    shape: DFlashShape = DFlashShape()
    train: DFlashTrainConfig


# Files each stage leaves in the work directory; they are deleted when its settings change.
_ARTIFACTS = {"tokenizer": ("tokenizer.json",), "target": ("target.npz",),
              "data": ("sequences.npy",), "drafter": ("drafter.npz",),
              "draft-data": ("draft_sequences.npy", "draft_labels.npy"),
              "draft-lm": ("draft_lm.npz",), "dflash": ("dflash.npz",)}


class Workspace:
    """The work directory: stage outputs, resumable checkpoints, and log.json with each stage's
    settings fingerprint, wall time and results.

    A stage's fingerprint chains the settings of every stage before it, so changing, say, the
    drafter's step count reruns the drafter and keeps the trained target.
    """

    def __init__(self, path: str, *, fresh: bool):
        self.path = path
        if fresh and os.path.isdir(path):
            shutil.rmtree(path)
        os.makedirs(path, exist_ok=True)
        self.log = self._read("log.json") or {}
        self._chain = ""

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def current(self, stage: str, settings) -> bool:
        """True when `stage` finished with these settings (after the same earlier stages).
        Otherwise a stage run with other settings is forgotten and its files deleted, while
        an interrupted run with the same settings keeps its checkpoint to resume from."""
        blob = json.dumps([self._chain, stage, settings], sort_keys=True, default=_plain)
        self._chain = hashlib.sha1(blob.encode()).hexdigest()
        entry = self.log.get(stage, {})
        if entry.get("fingerprint") == self._chain:
            return bool(entry.get("done"))
        for name in _ARTIFACTS.get(stage, ()):
            if os.path.exists(self.file(name)):
                os.remove(self.file(name))
        self.log[stage] = {"fingerprint": self._chain}
        self._write("log.json", self.log)
        return False

    def record(self, stage: str, **values) -> None:
        self.log.setdefault(stage, {}).update(values)
        self._write("log.json", self.log)

    def _read(self, name):
        if not os.path.isfile(self.file(name)):
            return None
        with open(self.file(name)) as f:
            return json.load(f)

    def _write(self, name, value) -> None:
        with open(self.file(name) + ".tmp", "w") as f:
            json.dump(value, f, indent=2)
        os.replace(self.file(name) + ".tmp", self.file(name))


def _plain(value):
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else str(value)


def build_pair(recipe: PairRecipe, out: str, work: Workspace, *, stop_after: str = "eval",
               progress: bool = True, command: str = "") -> dict:
    """Runs the stages up to `stop_after`; returns the work log (timings, losses, quality)."""
    from tokenizers import Tokenizer

    from lightspec_jax.checkpoint import load_eagle3, load_qwen3, save_eagle3_hf, save_qwen3_hf

    target_dir, drafter_dir = os.path.join(out, "target"), os.path.join(out, "drafter")
    tok_path = work.file("tokenizer.json")

    # -- tokenizer (the corpus is rebuilt each run: it takes seconds)
    t0 = time.perf_counter()
    corpus = build_corpus(recipe.corpus)
    if not work.current("tokenizer", [recipe.corpus, recipe.vocab_size]):
        train_tokenizer(corpus.documents, vocab_size=recipe.vocab_size).save(tok_path)
        work.record("tokenizer", seconds=time.perf_counter() - t0, corpus=corpus.summary(),
                    done=True)
    tokenizer = Tokenizer.from_file(tok_path)
    eos = eos_id(tokenizer)
    stream = TokenStream.from_documents(tokenizer, corpus.documents, eos_id=eos)
    work.record("tokenizer", train_tokens=int(len(stream.train)),
                valid_tokens=int(len(stream.valid)))
    if stop_after == "tokenizer":
        return work.log

    # -- target
    target_settings = [recipe.target_model, recipe.target, recipe.dtype]
    if not work.current("target", target_settings) or not _is_hf_dir(target_dir):
        model_cfg = dataclasses.replace(recipe.target_model, vocab_size=tokenizer.get_vocab_size(),
                                        eos_token_ids=(eos,))
        model = Qwen3(model_cfg, rngs=nnx.Rngs(recipe.target.seed))
        log = train_target(model, stream, recipe.target, checkpoint=work.file("target.npz"),
                           progress=progress)
        _cast(model, recipe.dtype)
        _save_lm(model, target_dir, tok_path, eos, save_qwen3_hf)
        valid = validation_loss(load_qwen3(target_dir, dtype="float32"), stream,
                                batch_size=recipe.target.batch_size, seq_len=recipe.target.seq_len)
        work.record("target", seconds=log.seconds, steps=len(log.losses), final=log.final(),
                    valid_loss=valid, curve=_curve(log), done=True)
    if stop_after == "target":
        return work.log

    # -- greedy data from the shipped (rounded) target: the drafter learns what it will serve
    target = load_qwen3(target_dir, dtype="float32")
    d = recipe.drafter
    data_settings = [d.num_sequences, d.prompt_len, d.gen_len, d.gen_batch, d.seed]
    if not work.current("data", data_settings):
        t0 = time.perf_counter()
        np.save(work.file("sequences.npy"), build_sequences(target, stream, d, progress=progress))
        work.record("data", seconds=time.perf_counter() - t0, done=True)
    sequences = np.load(work.file("sequences.npy"))
    if stop_after == "data":
        return work.log

    # -- drafter
    if not work.current("drafter", [d]) or not _is_hf_dir(drafter_dir):
        vd = d.draft_vocab_size
        vocab = None if vd is None else select_draft_vocab(
            sequences[:, 1:], vocab_size=target.config.vocab_size, draft_vocab_size=vd)
        t2d = (np.arange(target.config.vocab_size, dtype=np.int32) if vocab is None
               else vocab.t2d)
        drafter = new_drafter(target, vocab, seed=d.seed)
        log = train_eagle3(drafter, target, sequences, t2d, d,
                           checkpoint=work.file("drafter.npz"), progress=progress)
        _cast(drafter, recipe.dtype)
        save_eagle3_hf(drafter, drafter_dir, layout="legacy")
        work.record("drafter", seconds=log.seconds, steps=len(log.losses), final=log.final(),
                    curve=_curve(log), done=True,
                    draft_vocab={"size": vd or target.config.vocab_size,
                                 "coverage": 1.0 if vocab is None else vocab.coverage})
    load_eagle3(drafter_dir, target_config=target.config)  # fails loudly if unloadable
    if stop_after == "drafter":
        return work.log

    # -- quality through the public engine (always rerun: it is what the report states)
    from .report import write_report

    _timed_eval(work, "eval", recipe, target_dir, drafter_dir, progress)
    write_report(os.path.join(out, "TRAINING.md"), recipe=recipe, log=work.log, out=out,
                 command=command)
    return work.log


def build_draft_lm(recipe: DraftLMRecipe, out: str, work: Workspace, *, progress: bool = True,
                   command: str = "") -> dict:
    """Trains a draft LM for the target in out/target, writes out/draft-lm (Hugging Face Qwen3
    with the target's own tokenizer.json) and its section of out/TRAINING.md; returns the log.

    Every stage's fingerprint includes digests of the target's weights and tokenizer, so a
    retrained target reruns them all. Retraining the pair rewrites TRAINING.md without this
    section: run this stage again after it.
    """
    from tokenizers import Tokenizer

    from lightspec_jax.checkpoint import load_qwen3, save_qwen3_hf
    from lightspec_jax.checkpoint.qwen3 import param_count

    draft_dir = os.path.join(out, DRAFT_LM_DIR)
    target_dir, tok_path, target, sequences, labels, cut = _target_and_data(
        recipe, out, work, progress)
    tr = recipe.train
    eos = eos_id(Tokenizer.from_file(tok_path))

    # -- the draft LM
    if not work.current("draft-lm", [recipe.shape, tr, recipe.dtype]) or not _is_hf_dir(draft_dir):
        model = Qwen3(recipe.shape.config(target.config), rngs=nnx.Rngs(tr.seed))
        log = train_draft_lm(model, sequences[:cut], labels[:cut], tr,
                             checkpoint=work.file("draft_lm.npz"), progress=progress)
        _cast(model, recipe.dtype)
        _save_lm(model, draft_dir, tok_path, eos, save_qwen3_hf)
        held_out = agreement(load_qwen3(draft_dir, dtype="float32"), sequences[cut:],
                             labels[cut:])
        work.record("draft-lm", seconds=log.seconds, steps=len(log.losses), final=log.final(),
                    held_out=held_out, curve=_curve(log), params=param_count(model), done=True)

    # -- quality through the public engine (the draft LM as drafter_path)
    from .report import write_draft_lm_section

    _timed_eval(work, "draft-eval", recipe, target_dir, draft_dir, progress)
    write_draft_lm_section(os.path.join(out, "TRAINING.md"), recipe=recipe, log=work.log,
                           draft_dir=draft_dir, command=command)
    return work.log


def build_dflash(recipe: "DFlashRecipe", out: str, work: Workspace, *, progress: bool = True,
                 command: str = "") -> dict:
    """Trains a DFlash block drafter for the target in out/target on the draft LM's greedy
    data, writes out/dflash (the z-lab layout) and its section of out/TRAINING.md; the log."""
    from lightspec_jax.checkpoint import load_dflash, save_dflash_hf

    from .dflash import held_out_metrics, train_dflash

    dflash_dir = os.path.join(out, DFLASH_DIR)
    target_dir, _, target, sequences, labels, cut = _target_and_data(recipe, out, work, progress)
    tr = recipe.train
    if not work.current("dflash", [recipe.shape, tr, recipe.dtype]) or not _is_hf_dir(dflash_dir):
        drafter = DFlash(recipe.shape.config(target.config), rngs=nnx.Rngs(tr.seed))
        log = train_dflash(drafter, target, sequences[:cut], labels[:cut], tr,
                           checkpoint=work.file("dflash.npz"), progress=progress)
        _cast(drafter, recipe.dtype)
        save_dflash_hf(drafter, dflash_dir)
        shipped = load_dflash(dflash_dir, target_config=target.config, dtype="float32")
        held_out = held_out_metrics(shipped, target, sequences[cut:], labels[cut:], tr)
        params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(drafter,
                                                                               nnx.Param)))
        work.record("dflash", seconds=log.seconds, steps=len(log.losses), final=log.final(),
                    held_out=held_out, curve=_curve(log), params=params, done=True)

    from .report import write_dflash_section

    _timed_eval(work, "dflash-eval", recipe, target_dir, dflash_dir, progress)
    write_dflash_section(os.path.join(out, "TRAINING.md"), recipe=recipe, log=work.log,
                         dflash_dir=dflash_dir, command=command)
    return work.log


def _target_and_data(recipe, out: str, work: Workspace, progress: bool):
    """The trained pair's target and the greedy data a second drafter is distilled on:
    (target_dir, tok_path, target, sequences [N, T], labels [N, T], cut = the first held-out
    sequence). Stage "draft-data": its fingerprint holds digests of the target's weights and
    tokenizer, so a retrained target regenerates it, and every drafter trained with the same
    data settings reuses one copy."""
    from tokenizers import Tokenizer

    from lightspec_jax.checkpoint import load_qwen3

    target_dir = os.path.join(out, "target")
    tok_path = os.path.join(target_dir, "tokenizer.json")
    if not _is_hf_dir(target_dir) or not os.path.isfile(tok_path):
        raise FileNotFoundError(
            f"{target_dir} holds no trained target with its tokenizer.json; a second drafter "
            "is trained for an existing pair: run the same command without --stage first")
    # The target's tokenizer, never a new one: the drafter must propose the target's ids.
    tokenizer = Tokenizer.from_file(tok_path)
    stream = TokenStream.from_documents(tokenizer, build_corpus(recipe.corpus).documents,
                                        eos_id=eos_id(tokenizer))
    target = load_qwen3(target_dir, dtype="float32")
    tr = recipe.train
    target_id = [_digest(os.path.join(target_dir, "model.safetensors")), _digest(tok_path)]
    data_settings = [target_id, recipe.corpus, tr.num_sequences, tr.prompt_len, tr.gen_len,
                     tr.gen_batch, tr.seed]
    if not work.current("draft-data", data_settings):
        t0 = time.perf_counter()
        sequences = build_sequences(target, stream, tr, progress=progress)
        labels = distill_labels(target, sequences, prompt_len=tr.prompt_len)
        np.save(work.file("draft_sequences.npy"), sequences)
        np.save(work.file("draft_labels.npy"), labels)
        work.record("draft-data", seconds=time.perf_counter() - t0, done=True)
    sequences = np.load(work.file("draft_sequences.npy"))
    labels = np.load(work.file("draft_labels.npy"))
    cut = len(sequences) - tr.held_out
    if cut < 1:
        raise ValueError(f"held_out={tr.held_out} leaves none of the {len(sequences)} "
                         "sequences to train on")
    return target_dir, tok_path, target, sequences, labels, cut


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()


def _is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and \
        os.path.isfile(os.path.join(path, "model.safetensors"))


def _cast(model: nnx.Module, dtype: str) -> None:
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), state))


def _save_lm(model: Qwen3, directory: str, tok_path: str, eos: int, save_qwen3_hf) -> None:
    """A Hugging Face causal LM directory transformers' AutoModelForCausalLM loads."""
    save_qwen3_hf(model, directory)
    shutil.copyfile(tok_path, os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos, "do_sample": False}, f, indent=2)


def _curve(log: TrainLog, points: int = 10) -> list[list[float]]:
    """[step, mean loss over the preceding stretch] at `points` evenly spaced steps."""
    n = len(log.losses)
    if not n:
        return []
    edges = np.linspace(0, n, min(points, n) + 1).astype(int)
    return [[int(b), float(np.mean(log.losses[a:b]))] for a, b in zip(edges, edges[1:])]


def _timed_eval(work, stage: str, recipe, target_dir: str, drafter_dir: str, progress) -> None:
    """Quality of a target + drafter through the public engine, recorded as `stage`."""
    from .quality import evaluate_pair

    work.current(stage, [recipe.eval_prompts, recipe.eval_tokens, recipe.eval_k])
    t0 = time.perf_counter()
    quality = evaluate_pair(target_dir, drafter_dir, num_prompts=recipe.eval_prompts,
                            max_tokens=recipe.eval_tokens,
                            num_speculative_tokens=recipe.eval_k, progress=progress)
    work.record(stage, seconds=time.perf_counter() - t0, quality=quality, done=True)
