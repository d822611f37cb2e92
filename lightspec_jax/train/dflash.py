"""Training a DFlash block drafter for the shipped target by distillation from it.

Data: the draft LM's (draft_lm.py): corpus windows continued by the target's greedy tokens, with
the target's argmax at every position as the label. Each training step draws M anchors per
sequence at random; the block at anchor a is [token a, mask x (P-1)] over the context of the
target's features at positions < a (forward.dflash_blocks, the serving block forward over many
anchors at once), and row i learns the target's argmax at position a + i - 1, the token it will
have to match at a + i. Row i's cross-entropy is weighted decay^(i-1): a draft only counts when
every draft before it is accepted, so early rows matter most (the DFlash paper weights block
positions with a decaying schedule for the same reason). The target, its embedding and its head
are frozen; its features come from one forward of the target per batch.

Metrics: acc_i, row i's top-1 agreement; tau, the mean acceptance length of a greedy verify of
the whole block (1 + the leading agreements), the number serving at depth P - 1 can reach.

Axis legend: N sequences, B batch, T sequence length, M anchors per sequence, P block rows,
H hidden, F feature width, V vocab.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lightspec_jax.models import DFlash, DFlashConfig, Qwen3

from .draft_lm import IGNORE, DraftLMTrainConfig
from .forward import dflash_blocks, qwen3_hidden
from .loop import TrainLog, run


@dataclasses.dataclass(frozen=True, kw_only=True)
class DFlashShape:
    """The drafter's own choices; its widths are the target's (it reads the target's
    embedding and head)."""

    num_layers: int = 2
    block_size: int = 8  # P: the bonus token + 7 drafts, the engine's largest K by default
    target_layer_ids: tuple[int, ...] = (1, 3, 5)  # target layers whose OUTPUT is a feature

    def config(self, target) -> DFlashConfig:
        return DFlashConfig.for_target(target, num_layers=self.num_layers,
                                       block_size=self.block_size,
                                       target_layer_ids=tuple(self.target_layer_ids))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DFlashTrainConfig(DraftLMTrainConfig):
    """The draft LM's settings (the same greedy data: sequences, held-out split, seed) plus
    the block's own."""

    anchors: int = 16  # M blocks per sequence per step
    row_decay: float = 0.8  # weight of block row i: row_decay ** (i - 1)


def dflash_loss(drafter: DFlash, target: Qwen3, tokens: jax.Array, labels: jax.Array,
                anchors: jax.Array, *, row_decay: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted block cross-entropy over tokens/labels [B, T] at anchors [B, M] (labels: the
    target's argmax per position, IGNORE where none); metrics acc_i and tau."""
    cfg = drafter.config
    p_len = cfg.block_size
    embed = jax.lax.stop_gradient(target.embed[...])  # [V, H]
    head = embed.T if target.lm_head is None else jax.lax.stop_gradient(target.lm_head[...])
    feats = jax.lax.stop_gradient(jax.vmap(
        lambda seq: qwen3_hidden(target, seq, cfg.aux_layers)[1])(tokens))  # [B, T, F]
    hidden = jax.vmap(lambda f, s, a: dflash_blocks(drafter, embed, f, s, a))(
        feats, tokens, anchors)  # [B, M, P, H]
    logits = jnp.einsum("bmph,hv->bmpv", hidden[:, :, 1:], head.astype(hidden.dtype),
                        preferred_element_type=jnp.float32)  # [B, M, P-1, V]
    at = anchors[:, :, None] + jnp.arange(p_len - 1)  # [B, M, P-1]: row i reads label a+i-1
    row_labels = jnp.take_along_axis(labels[:, None, :], at, axis=2)  # [B, M, P-1]
    valid = row_labels != IGNORE
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(row_labels, 0))
    weight = row_decay ** jnp.arange(p_len - 1, dtype=jnp.float32)  # [P-1]
    per_row = jnp.where(valid, ce, 0.0).sum((0, 1)) / jnp.maximum(valid.sum((0, 1)), 1)
    hit = (jnp.argmax(logits, axis=-1) == row_labels) & valid  # [B, M, P-1]
    metrics = {f"acc_{i + 1}": hit[..., i].sum() / jnp.maximum(valid[..., i].sum(), 1)
               for i in range(p_len - 1)}
    metrics["tau"] = 1.0 + jnp.cumprod(hit, axis=-1).sum(-1).mean()
    return (weight * per_row).sum() / weight.sum(), metrics


def draw_anchors(rng: np.random.Generator, batch: int, cfg: DFlashTrainConfig,
                 block_size: int, length: int) -> np.ndarray:
    """[B, M] int32 anchors, uniform over 1 .. T - P + 1 (every block row has a label)."""
    return rng.integers(1, length - block_size + 2, (batch, cfg.anchors)).astype(np.int32)


def train_dflash(drafter: DFlash, target: Qwen3, sequences: np.ndarray, labels: np.ndarray,
                 cfg: DFlashTrainConfig, *, checkpoint: str | None = None,
                 progress: bool = True) -> TrainLog:
    """Trains `drafter` in place on sequences/labels [N, T] (target frozen); the per-step log."""
    graphdef, params, rest = nnx.split(drafter, nnx.Param, ...)
    target_graph, target_state = nnx.split(target)
    per_epoch = max(len(sequences) // cfg.batch_size, 1)
    p_len, length = drafter.config.block_size, sequences.shape[1]

    def loss_fn(params, batch):
        target_state, tokens, batch_labels, anchors = batch
        return dflash_loss(nnx.merge(graphdef, params, rest),
                           nnx.merge(target_graph, target_state), tokens, batch_labels, anchors,
                           row_decay=cfg.row_decay)

    def batch(step):  # one seeded permutation per epoch; anchors seeded by the step
        epoch, i = divmod(step, per_epoch)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(sequences))
        rows = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
        anchors = draw_anchors(np.random.default_rng([cfg.seed, 1, step]), len(rows), cfg,
                               p_len, length)
        return (target_state, jnp.asarray(sequences[rows]), jnp.asarray(labels[rows]),
                jnp.asarray(anchors))

    params, log = run(params, loss_fn, batch, cfg.optim, checkpoint=checkpoint,
                      desc="DFlash", progress=progress)
    nnx.update(drafter, params)
    return log


def held_out_metrics(drafter: DFlash, target: Qwen3, sequences: np.ndarray, labels: np.ndarray,
                     cfg: DFlashTrainConfig, *, batch_size: int = 16) -> dict[str, float]:
    """Loss, acc_i and tau over held-out sequences/labels [N, T], at seeded anchors."""
    fn = nnx.jit(dflash_loss, static_argnames="row_decay")
    rng = np.random.default_rng([cfg.seed, 2])
    totals: dict[str, float] = {}
    count = 0
    for start in range(0, len(sequences), batch_size):
        tokens = sequences[start:start + batch_size]
        anchors = draw_anchors(rng, len(tokens), cfg, drafter.config.block_size, tokens.shape[1])
        loss, metrics = fn(drafter, target, jnp.asarray(tokens),
                           jnp.asarray(labels[start:start + batch_size]), jnp.asarray(anchors),
                           row_decay=cfg.row_decay)
        for key, value in {"loss": loss, **metrics}.items():
            totals[key] = totals.get(key, 0.0) + float(value) * len(tokens)
        count += len(tokens)
    return {key: value / max(count, 1) for key, value in totals.items()}
