"""Training the tiny Qwen3 target: next-token cross-entropy over packed windows."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lightspec_jax.models import Qwen3, Qwen3Config

from .data import TokenStream
from .forward import qwen3_logits
from .loop import OptimConfig, TrainLog, run


def tiny_target_config(*, vocab_size: int, eos_id: int) -> Qwen3Config:
    """The shipped target's shape: 8 layers keep Eagle3's feature layers 2, L//2, L-3 = 2, 4, 5
    distinct (at L = 6 the last two coincide); head_dim 64 = hidden / heads."""
    return Qwen3Config(vocab_size=vocab_size, hidden_size=256, intermediate_size=768,
                       num_layers=8, num_heads=4, num_kv_heads=2, head_dim=64,
                       rope_theta=10_000.0, tie_word_embeddings=True,
                       max_position_embeddings=512, eos_token_ids=(eos_id,))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetTrainConfig:
    optim: OptimConfig
    batch_size: int = 8
    seq_len: int = 512  # window length T = the model's max positions
    seed: int = 0


def next_token_loss(model: Qwen3, windows: jax.Array) -> jax.Array:
    """Mean cross-entropy of windows [B, T+1]: rows 0..T-1 predict tokens 1..T."""
    logits = qwen3_logits(model, windows[:, :-1])  # [B, T, V] fp32
    return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]).mean()


def train_target(model: Qwen3, stream: TokenStream, cfg: TargetTrainConfig, *,
                 checkpoint: str | None = None, progress: bool = True) -> TrainLog:
    """Trains `model` in place; returns the per-step log. checkpoint: a resumable .npz path."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_fn(params, windows):
        loss = next_token_loss(nnx.merge(graphdef, params, rest), windows)
        return loss, {}

    def batch(step):
        return jnp.asarray(stream.windows(step, batch_size=cfg.batch_size, length=cfg.seq_len + 1,
                                          seed=cfg.seed))

    params, log = run(params, loss_fn, batch, cfg.optim, checkpoint=checkpoint,
                      desc="target", progress=progress)
    nnx.update(model, params)
    return log


def validation_loss(model: Qwen3, stream: TokenStream, *, batch_size: int, seq_len: int,
                    batches: int = 4, seed: int = 0) -> float:
    """Mean next-token loss on windows of the held-out tail of the stream."""
    fn = nnx.jit(next_token_loss)
    losses = [float(fn(model, jnp.asarray(stream.windows(i, batch_size=batch_size,
                                                         length=seq_len + 1, seed=seed,
                                                         split="valid"))))
              for i in range(batches)]
    return float(np.mean(losses))
