"""Training a small Qwen3 draft LM for the shipped target: the drafter of vanilla speculative
decoding, and what transformers' assisted generation takes as `assistant_model=` (it has no
Eagle3 class; an assistant must be an ordinary causal LM with the target's vocabulary).

Distilled, not trained on the corpus: a draft model is only ever judged on agreeing with the
target's greedy choice, and a 1.5M-parameter model cannot learn the corpus well enough for its
own argmax to track a target that (being tiny itself) often loops. So it learns the target:
sequence-level knowledge distillation (Kim & Rush, 2016, "Sequence-Level Knowledge
Distillation": train the student on the teacher's greedy outputs), on the same data the Eagle3
drafter learns from - corpus windows continued by the target's greedy tokens (eagle3.py
`build_sequences`, same windows and seed) - with the target's argmax as the label at every
position. On the continuation that label is the next token itself; on the corpus window it
comes from one target forward, so the model also learns what the target says right after text
it did not write (a prompt). Hard labels, not the target's full distribution: storing V-wide
soft labels is out of reach and a per-step target forward would cost more than the training
itself, while greedy acceptance only asks for the argmax.

Axis legend: N sequences, B batch, T sequence length, P prompt (corpus) length, V vocab.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lightspec_jax.models import Qwen3, Qwen3Config

from .forward import qwen3_logits
from .loop import OptimConfig, TrainLog, run

IGNORE = -1  # label of a position that carries no loss (the last one of each sequence)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftLMShape:
    """The draft LM's own sizes; everything else comes from the target (`config`)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 64
    intermediate_size: int = 384

    def config(self, target: Qwen3Config) -> Qwen3Config:
        """A Qwen3 sharing the target's vocabulary, EOS, positions and RoPE base; tied
        embeddings store the V x H table (most of its parameters) once."""
        return Qwen3Config(vocab_size=target.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=self.num_layers,
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                           head_dim=self.head_dim, rope_theta=target.rope_theta,
                           rms_norm_eps=target.rms_norm_eps, tie_word_embeddings=True,
                           max_position_embeddings=target.max_position_embeddings,
                           eos_token_ids=target.eos_token_ids)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftLMTrainConfig:
    optim: OptimConfig
    batch_size: int = 16
    # The greedy data: the fields and defaults of Eagle3TrainConfig, so `build_sequences`
    # draws the same windows and continuations the Eagle3 drafter was trained on.
    num_sequences: int = 1024
    prompt_len: int = 128  # corpus tokens before each greedy continuation
    gen_len: int = 128  # greedy tokens the target appends
    gen_batch: int = 64
    held_out: int = 64  # sequences kept out of training to measure agreement on
    seed: int = 0


def distill_labels(target: Qwen3, sequences: np.ndarray, *, prompt_len: int,
                   batch_size: int = 32) -> np.ndarray:
    """The target's argmax at every position of sequences [N, T] -> labels [N, T] int32.

    Positions before prompt_len (corpus text) get it from a target forward over the prompt;
    later ones are the greedy continuation, whose next token already is the target's argmax.
    The last position has no next token: IGNORE.
    """
    logits_fn = nnx.jit(qwen3_logits)
    num, length = sequences.shape
    labels = np.full((num, length), IGNORE, np.int32)
    for start in range(0, num, batch_size):
        chunk = jnp.asarray(sequences[start:start + batch_size, :prompt_len])  # [B, P]
        labels[start:start + batch_size, :prompt_len] = np.asarray(
            jnp.argmax(logits_fn(target, chunk), axis=-1))
    labels[:, prompt_len:length - 1] = sequences[:, prompt_len + 1:]
    return labels


def draft_lm_loss(model: Qwen3, tokens: jax.Array, labels: jax.Array
                  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross-entropy of the draft LM against labels [B, T] (IGNORE masked) over tokens [B, T];
    metric acc = top-1 agreement with the labels, the chance a depth-1 greedy draft is right."""
    logits = qwen3_logits(model, tokens)  # [B, T, V] fp32
    valid = labels != IGNORE
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    count = jnp.maximum(valid.sum(), 1)
    hit = (jnp.argmax(logits, axis=-1) == labels) & valid
    return jnp.where(valid, ce, 0.0).sum() / count, {"acc": hit.sum() / count}


def train_draft_lm(model: Qwen3, sequences: np.ndarray, labels: np.ndarray,
                   cfg: DraftLMTrainConfig, *, checkpoint: str | None = None,
                   progress: bool = True) -> TrainLog:
    """Trains `model` in place on sequences/labels [N, T]; returns the per-step log."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    per_epoch = max(len(sequences) // cfg.batch_size, 1)

    def loss_fn(params, batch):
        tokens, batch_labels = batch
        return draft_lm_loss(nnx.merge(graphdef, params, rest), tokens, batch_labels)

    def batch(step):  # one seeded permutation per epoch
        epoch, i = divmod(step, per_epoch)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(sequences))
        rows = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
        return jnp.asarray(sequences[rows]), jnp.asarray(labels[rows])

    params, log = run(params, loss_fn, batch, cfg.optim, checkpoint=checkpoint,
                      desc="draft LM", progress=progress)
    nnx.update(model, params)
    return log


def agreement(model: Qwen3, sequences: np.ndarray, labels: np.ndarray, *,
              batch_size: int = 16) -> dict[str, float]:
    """Mean loss and top-1 agreement with the labels over sequences [N, T] (held-out data)."""
    fn = nnx.jit(draft_lm_loss)
    losses, accs, weights = [], [], []
    for start in range(0, len(sequences), batch_size):
        loss, metrics = fn(model, jnp.asarray(sequences[start:start + batch_size]),
                           jnp.asarray(labels[start:start + batch_size]))
        losses.append(float(loss))
        accs.append(float(metrics["acc"]))
        weights.append(int((labels[start:start + batch_size] != IGNORE).sum()))
    return {"loss": float(np.average(losses, weights=weights)),
            "acc": float(np.average(accs, weights=weights))}
