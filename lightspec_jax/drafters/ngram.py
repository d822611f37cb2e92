"""N-gram (prompt lookup) drafting: proposals copied from earlier tokens, no model.

Each slot keeps its token history on the device (x_p at p, the same positions as the target's
KV strip). To draft, the slot's last n tokens (its suffix, the bonus token included) are looked
up in its earlier history, longest n first (max_n down to min_n): the most recent earlier
occurrence wins, and the tokens that followed it there are the proposal, up to the depth and
never past the known history. A slot without a match proposes nothing (its proposal length is
0), so it verifies only its target row. Everything is vectorised over slots inside the draft
executable: no per-request work on the host. (Prompt lookup decoding as in transformers'
`PromptLookupCandidateGenerator` and vLLM's `ngram` method; this is our own device form.)

Shared lookup (`shared`, on by default): where a slot's own history has no match of a size,
the same suffix is looked up in the other requests' tokens before a shorter size is tried:
every slot's current history (the requests decoding beside it, prompts included) and each
slot's earlier requests, kept when a new prompt takes the slot (KEPT_ROWS over all slots, at
least one a slot). Requests of one workload repeat one another (templated answers, shared
system prompts, code idioms): replayed offline on the shipped pair's greedy math outputs at
depth 3, proposals committed 1.13 tokens a step from each request's own history and 2.21
with the requests served before it as well. The lookup is a hash table per size, built on
the device from every window of those histories (the latest window wins a bucket), probed
once per slot and checked token by token, so its cost grows with the histories' length, not
with slots x histories. (Cross-request lookup in the spirit of SuffixDecoding, arXiv
2411.04975, and vLLM's `suffix` method; this is our own device form.)

Confidence for the fill, learned online: a proposal from an n-token match is scored by the
acceptance rate measured so far for n-token matches (own and shared ones apart). When a slot
drafts again, its previous proposal is checked against the tokens committed since (the
target's own tokens up to the first rejection): each checked position is one trial, a hit
while the draft equals the committed token, and the first miss ends the check. The hits and
trials per match key decay as EMAs on the device, starting from a prior (`prior_hits` /
`prior_trials`). The planner's own statistics set the budget; these confidences only rank
rows across requests, so longer, more reliable matches are verified first.

Axis legend: N slots, S cache length (positions), K max draft depth, n match length.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .base import Drafter, DraftRows, Proposal


class NgramCache(NamedTuple):
    tokens: jax.Array  # [N, S] i32: x_p at p (positions >= the committed length are stale)
    length: jax.Array  # [N] i32: known positions of each slot's history (0 .. length - 1)
    previous: jax.Array  # [N, H, S'] i32: each slot's last H requests, newest first (shared)
    previous_len: jax.Array  # [N, H] i32: their known lengths (0: none)
    last_tokens: jax.Array  # [N, K] i32: each slot's previous proposal
    last_len: jax.Array  # [N] i32: its length (0: none to check)
    last_start: jax.Array  # [N] i32: the position its first token would take
    last_n: jax.Array  # [N] i32: the match length that produced it
    # EMAs of accepted and of checked positions per match key: n for a match in the slot's
    # own history, max_n + 1 + n for a shared one. [(max_n + 1) x (2 if shared else 1)] f32.
    hits: jax.Array
    trials: jax.Array


class NgramConfig(NamedTuple):
    min_n: int
    max_n: int
    decay: float  # EMA weight kept per draft step that checks a proposal
    prior_hits: float
    prior_trials: float
    shared: bool  # also look up the other slots' histories and previous requests


class NgramDrafter(Drafter):
    """Prompt-lookup drafter (`SpeculativeConfig(method="ngram")`): needs only the target."""

    method = "ngram"
    short_proposals = True

    def __init__(self, *, min_n: int = 1, max_n: int = 3, decay: float = 0.99,
                 prior_hits: float = 2.0, prior_trials: float = 4.0, shared: bool = True):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got min_n={min_n}, "
                             f"max_n={max_n}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if not 0.0 <= prior_hits <= prior_trials or prior_trials <= 0.0:
            raise ValueError(f"need 0 <= prior_hits <= prior_trials and prior_trials > 0, got "
                             f"{prior_hits}, {prior_trials}")
        # No module and no parameters: the drafter is its cache and these settings.
        self.graphdef, self.param_leaves, self._treedef = None, [], None
        self.config = NgramConfig(min_n, max_n, decay, prior_hits, prior_trials, bool(shared))

    def module(self, param_leaves):
        raise TypeError("an n-gram drafter has no module")

    def new_cache(self, *, num_slots: int, cache_len: int) -> NgramCache:
        cfg = self.config
        n, k = num_slots, 16  # K <= 15: the widest proposal fits
        m = (cfg.max_n + 1) * (2 if cfg.shared else 1)
        # Earlier requests kept per slot: KEPT_ROWS over the slots (at c = 1 the last 16), so
        # that few slots still look up several; none without sharing.
        kept = -(-KEPT_ROWS // n) if cfg.shared else 0
        return NgramCache(tokens=jnp.zeros((n, cache_len), jnp.int32),
                          length=jnp.zeros((n,), jnp.int32),
                          previous=jnp.zeros((n, kept, cache_len), jnp.int32),
                          previous_len=jnp.zeros((n, kept), jnp.int32),
                          last_tokens=jnp.zeros((n, k), jnp.int32),
                          last_len=jnp.zeros((n,), jnp.int32),
                          last_start=jnp.zeros((n,), jnp.int32),
                          last_n=jnp.zeros((n,), jnp.int32),
                          hits=jnp.full((m,), cfg.prior_hits, jnp.float32),
                          trials=jnp.full((m,), cfg.prior_trials, jnp.float32))

    def prefill(self, param_leaves, cache, rows: DraftRows, *, target_embed):
        # A new prompt in a slot: its previous request's proposal is not checked against it.
        if self.config.shared:  # a chunk from position 0 starts a new request: keep the old
            n = cache.length.shape[0]
            starts = jnp.zeros((n + 1,), bool).at[rows.slot].max(rows.position == 0)[:n]
            kept = jnp.concatenate([cache.tokens[:, None], cache.previous[:, :-1]], axis=1)
            kept_len = jnp.concatenate([cache.length[:, None], cache.previous_len[:, :-1]], 1)
            cache = cache._replace(
                previous=jnp.where(starts[:, None, None], kept, cache.previous),
                previous_len=jnp.where(starts[:, None], kept_len, cache.previous_len))
        return cache._replace(tokens=_write(cache.tokens, rows),
                              length=rows.prompt_length(cache.length),
                              last_len=cache.last_len.at[rows.slot].set(0, mode="drop"))

    def commit(self, param_leaves, cache, rows: DraftRows, *, tail_row, target_embed):
        # Every verify row's input token at its position: the accepted prefix is the committed
        # history; rows past it write positions at or beyond the new length, rewritten later.
        # Each slot with rows is known through its tail row (its last accepted one).
        return cache._replace(tokens=_write(cache.tokens, rows),
                              length=rows.verified_length(cache.length, tail_row))

    def draft(self, param_leaves, cache, *, last_token, seq_len, drafting, depth, max_depth,
              target_embed, sampling=None):
        # Lookup is deterministic given the history: its drafts are point masses (`sampling`
        # changes nothing; the step fills their distributions in).
        cfg = self.config
        n, s = cache.tokens.shape
        rows = jnp.arange(n)
        # The bonus token sits at seq_len (its KV is not written yet): history 0 .. seq_len.
        tokens = cache.tokens.at[rows, jnp.clip(seq_len, 0, s - 1)].set(last_token)
        length = jnp.minimum(seq_len + 1, s)  # [N] known tokens
        hits, trials = _learn(cache, tokens, length, drafting, cfg.decay)

        # Where proposals are copied from: the slot's own history, and with `shared` every
        # slot's current history, then every slot's earlier requests ([M, S]: M = N, or
        # N (1 + H)).
        sources, source_len = tokens, length
        if cfg.shared:
            current = jnp.where(drafting, length, cache.length)  # the others' known lengths
            sources = jnp.concatenate([tokens, cache.previous.reshape(-1, s)], axis=0)
            source_len = jnp.concatenate([current, cache.previous_len.reshape(-1)])
        source = rows  # [N] the row of `sources` the chosen match is in
        start = jnp.full((n,), -1, jnp.int32)  # continuation position of the chosen match
        matched = jnp.zeros((n,), jnp.int32)  # its key: n, or max_n + 1 + n if shared (0: none)
        for size in range(cfg.max_n, cfg.min_n - 1, -1):  # longest first: it wins
            at = _last_match(tokens, length, size)  # [N] match start or -1
            take = (matched == 0) & (at >= 0)
            start = jnp.where(take, at + size, start)
            matched = jnp.where(take, size, matched)
            if cfg.shared:  # no match of this size in the slot's own history: the others'
                row, at = _shared_match(sources, source_len, tokens, length, size)
                take = (matched == 0) & (at >= 0)
                source = jnp.where(take, row, source)
                start = jnp.where(take, at + size, start)
                matched = jnp.where(take, cfg.max_n + 1 + size, matched)
        offsets = jnp.arange(max_depth)  # [K]
        pos = start[:, None] + offsets[None, :]  # [N, K]
        known = ((matched > 0)[:, None] & (pos < source_len[source][:, None])
                 & (offsets[None, :] < depth) & drafting[:, None])
        proposal = jnp.where(known, sources[source[:, None], jnp.clip(pos, 0, s - 1)], 0)
        count = known.sum(axis=1).astype(jnp.int32)  # [N] (a prefix: pos only grows)
        rate = hits / jnp.maximum(trials, 1e-6)  # per match key
        confidence = jnp.where(known, rate[matched][:, None], 0.0).astype(jnp.float32)

        width = cache.last_tokens.shape[1]
        cache = cache._replace(
            tokens=tokens, length=jnp.where(drafting, length, cache.length), hits=hits,
            trials=trials,
            last_tokens=jnp.where(drafting[:, None], _pad(proposal, width), cache.last_tokens),
            last_len=jnp.where(drafting, count, cache.last_len),
            # Draft j lands at seq_len + 1 + j, after the bonus token.
            last_start=jnp.where(drafting, seq_len + 1, cache.last_start),
            last_n=jnp.where(drafting, matched, cache.last_n))
        return cache, Proposal(proposal.astype(jnp.int32), confidence, length=count)


def _write(history: jax.Array, rows: DraftRows) -> jax.Array:
    """history [N, S] with rows.token written at (rows.slot, rows.position); padding rows
    (slot N) and positions past the strip are dropped."""
    n, s = history.shape
    slot = jnp.where(rows.position < s, rows.slot, n)
    return history.at[slot, rows.position].set(rows.token.astype(jnp.int32), mode="drop")


def _last_match(tokens: jax.Array, length: jax.Array, size: int) -> jax.Array:
    """[N] the largest p with tokens[p : p + size] equal to the last `size` known tokens and
    p + size < length (so a token follows it), or -1. tokens [N, S], length [N]."""
    n, s = tokens.shape
    if size >= s:
        return jnp.full((n,), -1, jnp.int32)
    suffix_at = jnp.clip(length - size, 0, s - 1)  # [N]
    width = s - size  # candidate starts 0 .. S - size - 1
    same = jnp.ones((n, width), bool)
    for j in range(size):
        want = jnp.take_along_axis(tokens, jnp.clip(suffix_at + j, 0, s - 1)[:, None], 1)
        same &= tokens[:, j:j + width] == want  # [N, S - size]
    p = jnp.arange(width)
    ok = same & (p[None, :] + size < length[:, None]) & (length[:, None] > size)
    return jnp.max(jnp.where(ok, p[None, :], -1), axis=1).astype(jnp.int32)


# Earlier requests the shared lookup keeps, over all slots: each slot keeps ceil(KEPT_ROWS / N)
# of its own (a slot's leaves stay its own, so data parallelism splits them with the slots).
KEPT_ROWS = 16
# Buckets per window of the shared lookup's hash table (a power of two at least this many
# times the windows): a bucket keeps the latest window hashed to it, so a match is lost where
# a later window of another n-gram shares its bucket - about one query in ten at this load.
# At 8 the lookup cost twice as much on the CPU (2.3 ms against 1.1 at 64 slots, max_n 3).
# At most MAX_BUCKETS (16 MiB of int32 a size): past a million windows (256 slots of 4,096
# positions) the load grows instead, and more matches are lost.
TABLE_LOAD = 4
MAX_BUCKETS = 1 << 22
_HASH_MULTIPLIER = 1000003  # int32 arithmetic wraps: a polynomial hash of the window


def _hash(tokens: jax.Array, size: int, width: int) -> jax.Array:
    """[R, S] tokens -> [R, width] int32 hashes of tokens[:, p : p + size], p < width."""
    h = jnp.zeros((tokens.shape[0], width), jnp.int32)
    for j in range(size):
        h = h * jnp.int32(_HASH_MULTIPLIER) + tokens[:, j:j + width]
    return h


def _shared_match(sources: jax.Array, source_len: jax.Array, tokens: jax.Array,
                  length: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """Each slot's last `size` known tokens looked up in every row of `sources` [M, S] (known
    through source_len [M]) -> ([N] row, [N] start p of tokens equal to them with p + size <
    its row's length, or -1). The latest such window (highest row, then position) a hash
    table kept; tokens [N, S], length [N] the slots' histories."""
    m, s = sources.shape
    n = tokens.shape[0]
    if size >= s:
        return jnp.zeros((n,), jnp.int32), jnp.full((n,), -1, jnp.int32)
    width = s - size  # window starts 0 .. S - size - 1: a token follows each
    p = jnp.arange(width)
    usable = p[None, :] + size < source_len[:, None]  # [M, W]
    ids = jnp.where(usable, jnp.arange(m)[:, None] * width + p[None, :], -1)  # [M, W]
    buckets = min(1 << max(int(m * width * TABLE_LOAD - 1).bit_length(), 1), MAX_BUCKETS)
    table = jnp.full((buckets,), -1, jnp.int32).at[
        (_hash(sources, size, width) & (buckets - 1)).ravel()].max(ids.ravel())
    suffix_at = jnp.clip(length - size, 0, s - 1)[:, None] + jnp.arange(size)[None, :]
    suffix = jnp.take_along_axis(tokens, jnp.clip(suffix_at, 0, s - 1), 1)  # [N, size]
    hit = table[_hash(suffix, size, 1)[:, 0] & (buckets - 1)]  # [N] window id or -1
    row, at = jnp.maximum(hit, 0) // width, jnp.maximum(hit, 0) % width
    # A bucket holds whichever window hashed there last: the window must equal the suffix.
    window = sources[row[:, None], jnp.clip(at[:, None] + jnp.arange(size)[None, :], 0, s - 1)]
    found = (hit >= 0) & (window == suffix).all(axis=1) & (length > size)
    return row.astype(jnp.int32), jnp.where(found, at, -1).astype(jnp.int32)


def _learn(cache: NgramCache, tokens: jax.Array, length: jax.Array, drafting: jax.Array,
           decay: float) -> tuple[jax.Array, jax.Array]:
    """The hit/trial EMAs after checking each drafting slot's previous proposal against the
    tokens committed since: positions up to and including the first miss, as far as known."""
    n, s = tokens.shape
    width = cache.last_tokens.shape[1]
    offsets = jnp.arange(width)
    pos = cache.last_start[:, None] + offsets[None, :]  # [N, W]
    known = (offsets[None, :] < cache.last_len[:, None]) & (pos < length[:, None])
    # The bonus token was the target's own at the first rejection: known positions compare
    # the draft with the target's token, exactly the verification's test.
    equal = cache.last_tokens == jnp.take_along_axis(tokens, jnp.clip(pos, 0, s - 1), 1)
    hit = known & (jnp.cumprod(equal.astype(jnp.int32), axis=1) > 0)  # [N, W] leading hits
    # Checked: every hit, and the first known miss after them.
    first_miss = known & ~equal & (jnp.concatenate(
        [jnp.ones((n, 1), bool), hit[:, :-1]], axis=1))
    checked = hit | first_miss
    use = drafting & (cache.last_len > 0) & (cache.last_n > 0)  # [N]
    m = cache.hits.shape[0]
    by_n = jax.nn.one_hot(jnp.where(use, cache.last_n, m), m, dtype=jnp.float32)  # [N, m]
    new_hits = by_n.T @ hit.sum(axis=1).astype(jnp.float32)  # [m]
    new_trials = by_n.T @ checked.sum(axis=1).astype(jnp.float32)
    seen = new_trials > 0
    hits = jnp.where(seen, decay * cache.hits + new_hits, cache.hits)
    trials = jnp.where(seen, decay * cache.trials + new_trials, cache.trials)
    return hits, trials


def _pad(x: jax.Array, width: int) -> jax.Array:
    return jnp.pad(x, ((0, 0), (0, width - x.shape[1])))
