"""Token sampling on the device: greedy, temperature, top-k, top-p, per-request seeds.

Everything is per row, so requests with different parameters share one batch, and nothing
syncs with the host: what a batch needs (argmax only, a draw, or a draw after top-k/top-p) is a
static `SampleMode` the host picks from its requests' parameters, not a device-side branch -
on a GPU a `lax.cond` reads its predicate back to the host, which stalls the dispatch of the
whole step until the device reaches it. The random key of a row is derived from (request seed, position of the
token being sampled): the same request samples the same token at the same position whatever
it is batched with, and a speculative verify row samples exactly the token that plain decoding
would have sampled there, which keeps exact-match verification lossless at any temperature.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax
import jax.numpy as jnp


class SampleMode(enum.IntEnum):
    """What a batch's rows need, in increasing cost; a mode serves every row of a lower one
    with the same token (a greedy row is its argmax in every mode, filtering keeps every token
    of a row with top_k = 0 and top_p = 1)."""

    GREEDY = 0  # every row greedy: argmax only
    DRAW = 1  # some row samples at a temperature, none filters
    FILTER = 2  # some row samples with top-k or top-p


def _sortable_key(x: jax.Array) -> jax.Array:
    """f32 -> uint32 with the same order (-0.0 folded onto +0.0 so equal values tie)."""
    x = jnp.where(x == 0, 0.0, x)
    i = jax.lax.bitcast_convert_type(x, jnp.int32)
    i = jnp.where(i < 0, i ^ jnp.int32(0x7FFFFFFF), i)
    return jax.lax.bitcast_convert_type(i, jnp.uint32) ^ jnp.uint32(0x80000000)


def _largest_threshold(keys: jax.Array, weights: jax.Array, target: jax.Array) -> jax.Array:
    """Per row, the largest key t with sum(weights[keys >= t]) >= target, found bit by bit.

    keys [R, V] uint32, weights [R, V] >= 0, target [R] -> [R] uint32 (0 when none reaches it).
    The weighted count only changes at actual keys, so t is always one of the row's keys. 32
    masked reductions over [R, V] replace a full sort, which XLA on CPU does slowly.
    """
    def add_bit(bit, threshold):
        trial = threshold | (jnp.uint32(1) << (31 - bit).astype(jnp.uint32))
        mass = jnp.sum(jnp.where(keys >= trial[:, None], weights, 0), axis=-1)
        return jnp.where(mass >= target, trial, threshold)

    return jax.lax.fori_loop(0, 32, add_bit, jnp.zeros(keys.shape[:1], jnp.uint32))


def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Masks logits [R, V] outside each row's top-k and then top-p set with -inf.

    top_k [R] int32 (0 = off), top_p [R] f32 (1 = off). The order follows transformers'
    TopKLogitsWarper then TopPLogitsWarper; top-p keeps the smallest most-likely-first set whose
    mass reaches top_p (always at least the top token). Tokens tied with a threshold are kept
    (transformers breaks such ties by sort position instead).
    """
    keys = _sortable_key(logits)  # [R, V]
    k_threshold = _largest_threshold(keys, jnp.ones_like(logits), top_k.astype(jnp.float32))
    in_k = keys >= jnp.where(top_k > 0, k_threshold, 0)[:, None]
    probs = jax.nn.softmax(jnp.where(in_k, logits, -jnp.inf), axis=-1)  # [R, V]
    p_threshold = _largest_threshold(keys, probs, top_p)
    keep = in_k & (keys >= jnp.where(top_p < 1.0, p_threshold, 0)[:, None])
    return jnp.where(keep, logits, -jnp.inf)


# Independent random streams, each keyed by (request seed, position[, round]): the target's
# own sample (the one plain decoding draws; probabilistic verification's residual draw reuses
# it), and probabilistic verification's draft and accept test, which carry the round (the
# request's committed length when the proposal was made), so no two steps of a request ever
# reuse them.
TARGET_STREAM, ACCEPT_STREAM, DRAFT_STREAM = 0, 1, 3


def row_keys(seed: jax.Array, position: jax.Array, round_: jax.Array | None = None, *,
             stream: int = TARGET_STREAM) -> jax.Array:
    """One PRNG key per row from (seed [R] uint32, position [R] int32[, round [R] int32])."""
    base = jax.random.key(stream)
    fold = jax.random.fold_in
    if round_ is None:
        return jax.vmap(lambda s, p: fold(fold(base, s), p))(seed, position)
    return jax.vmap(lambda s, p, r: fold(fold(fold(base, s), p), r))(seed, position, round_)


def target_logits(logits: jax.Array, temperature: jax.Array, top_k: jax.Array,
                  top_p: jax.Array, mode: SampleMode) -> jax.Array:
    """The logits each row of logits [R, V] samples from: scaled by its temperature and, in
    FILTER mode, masked to its top-k / top-p set (-inf outside). Greedy rows are unscaled."""
    if mode == SampleMode.GREEDY:
        return logits
    scaled = logits / jnp.where(temperature <= 0.0, 1.0, temperature)[:, None]
    return filter_logits(scaled, top_k, top_p) if mode == SampleMode.FILTER else scaled


def draw(logits: jax.Array, scaled: jax.Array, temperature: jax.Array, seed: jax.Array,
         position: jax.Array) -> jax.Array:
    """The target's token per row: the argmax of logits [R, V] for greedy rows, else a draw
    from `scaled` (target_logits) keyed by (seed, position) -> [R] int32."""
    argmax = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    drawn = jax.vmap(jax.random.categorical)(row_keys(seed, position), scaled)
    return jnp.where(temperature <= 0.0, argmax, drawn).astype(jnp.int32)


def sample(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
           seed: jax.Array, position: jax.Array, mode: SampleMode = SampleMode.FILTER
           ) -> jax.Array:
    """Draws one token per row of logits [R, V] (fp32) -> [R] int32.

    temperature [R] (0 = greedy argmax), top_k [R], top_p [R], seed [R] uint32, position [R]:
    the sequence position of the token being sampled (for the key). mode (static): the
    cheapest SampleMode that covers every row that matters (the default covers all).
    """
    if mode == SampleMode.GREEDY:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return draw(logits, target_logits(logits, temperature, top_k, top_p, mode), temperature,
                seed, position)


# --- the drafter's side of probabilistic verification ----------------------------------------

class ProposalSampling(NamedTuple):
    """How a drafter samples its proposal per slot [N] (sampling.draw_proposal): the request's
    sampling values, the round (its committed length when drafting) and two static choices."""

    temperature: jax.Array  # [N] f32 (0: draft the argmax)
    top_k: jax.Array  # [N] i32
    top_p: jax.Array  # [N] f32
    seed: jax.Array  # [N] u32
    round: jax.Array  # [N] i32
    support: int  # M (static): the proposal distribution's most likely tokens kept
    vocab: int  # V (static): the target's vocabulary
    # (static) True: draw with the target's own noise for the position (its TARGET_STREAM
    # key over the target vocabulary), for exact-match verification; False: with independent
    # keys, for rejection sampling.
    coupled: bool = False


class Draw(NamedTuple):
    """One draft per row (target ids) and the distribution it was drawn from."""

    token: jax.Array  # [R] i32
    conf: jax.Array  # [R] f32: what the fill ranks; never depends on the drawn token
    q_ids: jax.Array  # [R, M] i32 target ids of the proposal distribution's support, -1 unused
    q_probs: jax.Array  # [R, M] f32 their probabilities (sum 1 over the used entries)


def point_mass(token: jax.Array, support: int) -> tuple[jax.Array, jax.Array]:
    """The distribution of a deterministic draft [R] in support form -> ([R, M], [R, M])."""
    ids = jnp.full(token.shape + (support,), -1, jnp.int32)
    probs = jnp.zeros(token.shape + (support,), jnp.float32)
    if support == 0:
        return ids, probs
    return ids.at[..., 0].set(token.astype(jnp.int32)), probs.at[..., 0].set(1.0)


def draw_proposal(logits: jax.Array, position: jax.Array, sampling: ProposalSampling | None,
                  to_target=None) -> Draw:
    """A draft per row of a drafter's logits [R, Vd] for the token at `position` [R];
    to_target maps the drafter's ids to the target's (a reduced draft vocabulary; None: the
    same vocabulary).

    Without `sampling` the draft is the argmax and its confidence its softmax probability.
    With it, a sampled row (temperature > 0) draws from q: the drafter's distribution at the
    request's temperature restricted to its top M tokens, then to the request's top-k /
    top-p, renormalised - the same shape of filter the target's p gets, so q resembles p. The
    token is drawn from exactly the q that is returned (the truncation is part of q), which
    rejection sampling needs. Its confidence is max q, known before the draw: the fill ranks
    drafts by it, and a rank that depended on which token was drawn would bias rejection
    sampling (a draft verified because it came out likely is not a draw from q any more).

    Coupled (exact-match verification): the draw uses the very noise the target's own sample
    at that position will use (the same key over the same vocabulary shape, so with
    Gumbel-max sampling the same Gumbel vector), so the draft equals the target's sample
    whenever q and p put the same token first under that noise - with q = p, always. Exact
    match still commits only the target's tokens; the coupling only makes drafts likelier to
    be right (Daliri, Musco, Suresh 2024, arXiv:2408.07978, "drafter-invariant" coupling).
    """
    to_target = to_target or (lambda ids: ids)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    argmax = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    top = jnp.take_along_axis(probs, argmax[:, None], axis=-1)[:, 0]
    best = to_target(argmax)
    support = 0 if sampling is None else sampling.support
    ids, q = point_mass(best, support)
    if sampling is None:
        return Draw(best, top, ids, q)
    s = sampling
    greedy = s.temperature <= 0.0
    scaled = logits.astype(jnp.float32) / jnp.where(greedy, 1.0, s.temperature)[:, None]
    values, top_ids = jax.lax.top_k(scaled, min(support, scaled.shape[-1]))  # most likely first
    pad = ((0, 0), (0, support - values.shape[-1]))  # a vocabulary smaller than M
    values = jnp.pad(values, pad, constant_values=-jnp.inf)
    top_ids = to_target(jnp.pad(top_ids, pad)).astype(jnp.int32)  # [R, M] target ids
    rank = jnp.arange(support)[None, :]
    probs_m = jax.nn.softmax(values, axis=-1)
    keep = (s.top_k[:, None] <= 0) | (rank < s.top_k[:, None])
    probs_m = jnp.where(keep, probs_m, 0.0)
    probs_m = probs_m / probs_m.sum(axis=-1, keepdims=True)
    before = jnp.cumsum(probs_m, axis=-1) - probs_m  # mass of the more likely entries
    keep &= (s.top_p[:, None] >= 1.0) | (before < s.top_p[:, None])
    probs_m = jnp.where(keep, probs_m, 0.0)
    probs_m = probs_m / probs_m.sum(axis=-1, keepdims=True)
    q_ids = jnp.where(probs_m > 0, top_ids, -1)
    if s.coupled:
        rows = jnp.arange(logits.shape[0])[:, None]
        full = jnp.full((logits.shape[0], s.vocab), -jnp.inf).at[
            rows, jnp.where(q_ids < 0, s.vocab, q_ids)].set(jnp.log(probs_m), mode="drop")
        drawn = jax.vmap(jax.random.categorical)(row_keys(s.seed, position), full)
    else:
        keys = row_keys(s.seed, position, s.round, stream=DRAFT_STREAM)
        pick = jax.vmap(jax.random.categorical)(keys, jnp.log(probs_m))  # [R]
        drawn = jnp.take_along_axis(top_ids, pick[:, None], axis=-1)[:, 0]
    return Draw(token=jnp.where(greedy, best, drawn).astype(jnp.int32),
                conf=jnp.where(greedy, top, probs_m[:, 0]),
                q_ids=jnp.where(greedy[:, None], ids, q_ids),
                q_probs=jnp.where(greedy[:, None], q, probs_m))
