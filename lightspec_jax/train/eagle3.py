"""Training the Eagle3 drafter by self-distillation from the frozen target.

Data: windows of the corpus continued by the target's own greedy decoding, so the drafter learns
on the text it will meet when drafting for that target. Features: the target's residual stream
entering its aux layers; labels: the target's argmax at every position (EAGLE-3 distils the
target's predictions, not the corpus tokens). Training-time test (forward.eagle3_unrolled):
step 0 reads the target features, steps 1..K-1 the drafter's own carried state, each step's
cross-entropy weighted 0.8^k as in SafeAILab/EAGLE `eagle/traineagle3/main.py`.
The draft vocab is the Vd most frequent target labels, sorted by id, mapped back by d2t offsets
(EAGLE `eagle/traineagle3/cnets.py` `scandata`); labels outside it carry no loss.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lightspec_jax.models import Eagle3, Eagle3Config, Qwen3

from .data import TokenStream
from .forward import eagle3_unrolled, qwen3_hidden
from .loop import OptimConfig, TrainLog, run


@dataclasses.dataclass(frozen=True, kw_only=True)
class Eagle3TrainConfig:
    optim: OptimConfig
    batch_size: int = 16
    ttt_steps: int = 4  # draft steps unrolled per position: step 0 + 3 from the carried state
    step_decay: float = 0.8  # weight of step k's loss: step_decay ** k
    draft_vocab_size: int | None = 2048  # None: the full target vocab, no d2t mapping
    num_sequences: int = 1024  # generated training sequences (reused across epochs)
    prompt_len: int = 128  # corpus tokens before each greedy continuation
    gen_len: int = 128  # greedy tokens the target appends
    gen_batch: int = 64  # sequences generated together
    seed: int = 0


# --- data: greedy continuations of corpus windows ------------------------------------------

def generate_greedy(model: Qwen3, prompts: np.ndarray, num_new: int) -> np.ndarray:
    """prompts [B, P] -> [B, P + num_new]: each row continued by the target's argmax (EOS is
    not a stop: a benchmark with ignore_eos sees the same text)."""
    graphdef, state = nnx.split(model)
    batch, length = prompts.shape
    return np.asarray(_generate(graphdef, state, jnp.asarray(prompts, jnp.int32), num_new=num_new,
                                batch=batch, length=length))


@functools.partial(jax.jit, static_argnames=("graphdef", "num_new", "batch", "length"))
def _generate(graphdef, state, prompts, *, num_new, batch, length):
    model = nnx.merge(graphdef, state)
    cache = model.new_cache(num_slots=batch, max_len=length + num_new)
    slots = jnp.repeat(jnp.arange(batch, dtype=jnp.int32), length)  # [B*P]
    positions = jnp.tile(jnp.arange(length, dtype=jnp.int32), batch)  # [B*P]
    last_rows = jnp.arange(batch) * length + length - 1  # [B]
    out = model(prompts.reshape(-1), positions, slots, cache, logits_rows=last_rows)
    first = jnp.argmax(out.logits, axis=-1).astype(jnp.int32)  # [B]

    def step(carry, pos):
        token, cache = carry
        out = model(token, jnp.full((batch,), pos, jnp.int32), jnp.arange(batch, dtype=jnp.int32),
                    cache)
        nxt = jnp.argmax(out.logits, axis=-1).astype(jnp.int32)
        return (nxt, out.cache), nxt

    _, rest = jax.lax.scan(step, (first, out.cache), length + jnp.arange(num_new - 1))
    return jnp.concatenate([prompts, first[:, None], rest.T], axis=1)  # [B, P + num_new]


def build_sequences(target: Qwen3, stream: TokenStream, cfg, *,
                    progress: bool = True) -> np.ndarray:
    """[num_sequences, prompt_len + gen_len]: corpus windows and their greedy continuations.

    cfg: an Eagle3TrainConfig or a DraftLMTrainConfig (its num_sequences, prompt_len, gen_len,
    gen_batch and seed; the same values give the same sequences)."""
    from tqdm.auto import tqdm

    chunks = []
    num_chunks = -(-cfg.num_sequences // cfg.gen_batch)
    for i in tqdm(range(num_chunks), desc="greedy data", disable=not progress):
        prompts = stream.windows(i, batch_size=cfg.gen_batch, length=cfg.prompt_len,
                                 seed=cfg.seed + 7919)
        chunks.append(generate_greedy(target, prompts, cfg.gen_len))
    return np.concatenate(chunks)[:cfg.num_sequences]


# --- draft vocabulary ----------------------------------------------------------------------

class DraftVocab(NamedTuple):
    d2t: np.ndarray  # [Vd] int32 offsets: target id = draft id + d2t[draft id]
    t2d: np.ndarray  # [V] int32: draft id of each target id, -1 outside the draft vocab
    coverage: float  # share of the counted labels inside the draft vocab


def select_draft_vocab(labels: np.ndarray, *, vocab_size: int, draft_vocab_size: int) -> DraftVocab:
    """The draft_vocab_size most frequent ids of `labels`, sorted by id (so d2t is
    non-decreasing and >= 0, as every loader expects); ties and unused ids fill by id."""
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in [1, {vocab_size}], got {draft_vocab_size}")
    counts = np.bincount(labels.reshape(-1), minlength=vocab_size)
    order = np.lexsort((np.arange(vocab_size), -counts))  # by count desc, then id
    kept = np.sort(order[:draft_vocab_size])
    t2d = np.full(vocab_size, -1, np.int32)
    t2d[kept] = np.arange(draft_vocab_size, dtype=np.int32)
    coverage = float(counts[kept].sum() / max(counts.sum(), 1))
    return DraftVocab((kept - np.arange(draft_vocab_size)).astype(np.int32), t2d, coverage)


# --- the loss ------------------------------------------------------------------------------

def drafter_loss(drafter: Eagle3, target: Qwen3, tokens: jax.Array, t2d: jax.Array, *,
                 num_steps: int, step_decay: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted training-time-test cross-entropy over tokens [B, T]; metrics acc_k = top-1
    agreement of draft step k with the target's argmax (rows with a label in the draft vocab)."""
    aux = drafter.config.aux_layer_ids
    embed = jax.lax.stop_gradient(target.embed[...])

    def features_and_labels(seq):  # the frozen target on one sequence
        hidden, feats = qwen3_hidden(target, seq, aux)
        return feats, jnp.argmax(target.logits(hidden), axis=-1)  # [T, A*H], [T]

    feats, labels = jax.lax.stop_gradient(jax.vmap(features_and_labels)(tokens))
    logits = jax.vmap(lambda f, s: eagle3_unrolled(drafter, embed, f, s, num_steps))(feats, tokens)
    t_len = tokens.shape[1]
    total, metrics = 0.0, {}
    for k, step_logits in enumerate(logits):  # [B, T, Vd]
        # Row t of step k predicts the target's token at position t + 2 + k, i.e. its argmax
        # at position t + 1 + k.
        shifted = jnp.concatenate([labels[:, 1 + k:], jnp.zeros((labels.shape[0], 1 + k),
                                                                labels.dtype)], axis=1)[:, :t_len]
        draft_label = t2d[shifted]  # [B, T], -1 outside the draft vocab
        valid = (jnp.arange(t_len) < t_len - 1 - k)[None, :] & (draft_label >= 0)
        ce = optax.softmax_cross_entropy_with_integer_labels(step_logits,
                                                             jnp.maximum(draft_label, 0))
        count = jnp.maximum(valid.sum(), 1)
        total = total + step_decay ** k * jnp.where(valid, ce, 0.0).sum() / count
        hit = (jnp.argmax(step_logits, axis=-1) == draft_label) & valid
        metrics[f"acc_{k}"] = hit.sum() / count
    return total, metrics


def new_drafter(target: Qwen3, vocab: DraftVocab | None, *, seed: int) -> Eagle3:
    """An Eagle3 shaped like one target layer over the target's default feature layers."""
    vd = target.config.vocab_size if vocab is None else len(vocab.d2t)
    drafter = Eagle3(Eagle3Config.for_target(target.config, draft_vocab_size=vd),
                     rngs=nnx.Rngs(seed))
    if vocab is not None:
        drafter.d2t.set_value(jnp.asarray(vocab.d2t))
    return drafter


def train_eagle3(drafter: Eagle3, target: Qwen3, sequences: np.ndarray, t2d: np.ndarray,
                 cfg: Eagle3TrainConfig, *, checkpoint: str | None = None,
                 progress: bool = True) -> TrainLog:
    """Trains `drafter` in place on sequences [N, T] (target frozen); returns the per-step log."""
    graphdef, params, rest = nnx.split(drafter, nnx.Param, ...)
    target_graph, target_state = nnx.split(target)
    t2d = jnp.asarray(t2d)
    per_epoch = max(len(sequences) // cfg.batch_size, 1)

    def loss_fn(params, batch):
        target_state, tokens = batch
        return drafter_loss(nnx.merge(graphdef, params, rest), nnx.merge(target_graph, target_state),
                            tokens, t2d, num_steps=cfg.ttt_steps, step_decay=cfg.step_decay)

    def batch(step):  # one seeded permutation per epoch
        epoch, i = divmod(step, per_epoch)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(sequences))
        rows = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
        return target_state, jnp.asarray(sequences[rows])

    params, log = run(params, loss_fn, batch, cfg.optim, checkpoint=checkpoint,
                      desc="drafter", progress=progress)
    nnx.update(drafter, params)
    return log
