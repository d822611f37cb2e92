"""A standalone draft language model (a small Qwen3 with its own KV cache) as the drafter.

The vanilla form of speculative decoding (a small model of the same family drafting for a large
one). It needs no target features. Its cache holds x_p at p like the target's: the commit
forward re-reads the verify rows, then drafting starts from the bonus token at new_seq_len.
The commit is a forward through every layer, so at the planner's floor the verify step only
records the rows' tokens and the draft model catches up before it drafts again (base.py).

`temperature` > 0 samples the drafts instead of taking the argmax (keys from the drafter's
own seed, slot and position - never the request's seed). `corrupt_rate` replaces each drafted
token, with that probability, by another one (keyed likewise, so runs are reproducible), and
`corrupt_from` replaces every token drafted for a position at or past it (a drafter that is
right early in a request and wrong later). With the target's own weights as the draft model
this gives a drafter that is right most of the time but not always: long accepted spans, full
acceptance and bonus tokens, next to partial rejections - what the lossless tests need.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from lightspec_jax.models import KVCache, Qwen3

from ..sampling import Draw, draw_proposal, point_mass
from .base import Drafter, DraftRows, chain, support


class DraftLMCache(NamedTuple):
    kv: KVCache  # [L, N, S, G, D] the draft model's K/V
    tokens: jax.Array  # [N, S] i32: the token at each position, as the verify rows read it
    length: jax.Array  # [N] i32: positions [0, length) hold current K/V (catch-up's start)


class DraftLMDrafter(Drafter):
    method = "draft_lm"
    catches_up = True

    def __init__(self, model: Qwen3, *, temperature: float = 0.0, corrupt_rate: float = 0.0,
                 corrupt_from: int | None = None, seed: int = 0):
        if not 0.0 <= corrupt_rate <= 1.0:
            raise ValueError(f"corrupt_rate must be in [0, 1], got {corrupt_rate}")
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        super().__init__(model)
        self.config = model.config
        self.temperature = temperature
        self.corrupt_rate = corrupt_rate
        self.corrupt_from = corrupt_from
        self.seed = seed

    def new_cache(self, *, num_slots: int, cache_len: int) -> DraftLMCache:
        cfg = self.config
        kv = KVCache.init(num_layers=cfg.num_layers, num_slots=num_slots, max_len=cache_len,
                          num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                          dtype=self.param_leaves[0].dtype)
        return DraftLMCache(kv, jnp.zeros((num_slots, cache_len), jnp.int32),
                            jnp.zeros((num_slots,), jnp.int32))

    def _forward(self, param_leaves, kv: KVCache, token, position, slot) -> KVCache:
        """The rows' K/V through every layer (each layer's K/V need the one below); logits of
        one row, which nothing reads. Padding rows (slot N) write nothing."""
        return self.module(param_leaves)(token, position, slot, kv,
                                         logits_rows=jnp.zeros((1,), jnp.int32)).cache

    @staticmethod
    def _keep(cache: DraftLMCache, rows: DraftRows) -> jax.Array:
        """[N, S] tokens with each row's token at its position (padding rows dropped)."""
        return cache.tokens.at[rows.slot, rows.position].set(rows.token, mode="drop")

    def prefill(self, param_leaves, cache, rows: DraftRows, *, target_embed):
        # A prompt chunk's rows are a slot's positions up to its end: current to there.
        return DraftLMCache(self._forward(param_leaves, cache.kv, rows.token, rows.position,
                                          rows.slot),
                            self._keep(cache, rows), rows.prompt_length(cache.length))

    def commit(self, param_leaves, cache, rows: DraftRows, *, tail_row, target_embed):
        # The verify rows' inputs, so the accepted prefix is in the draft model's cache.
        # Drafting starts from the bonus token, which the slot state holds: nothing to keep.
        # Each slot with rows is current through its tail row (its last accepted one).
        return DraftLMCache(self._forward(param_leaves, cache.kv, rows.token, rows.position,
                                          rows.slot),
                            self._keep(cache, rows), rows.verified_length(cache.length, tail_row))

    def record(self, param_leaves, cache, rows: DraftRows):
        return cache._replace(tokens=self._keep(cache, rows))

    def catch_up(self, param_leaves, cache, *, seq_len, window):
        n, s = cache.tokens.shape
        position = cache.length[:, None] + jnp.arange(window, dtype=jnp.int32)  # [N, W]
        missed = position < seq_len[:, None]  # [N, W]
        slot = jnp.where(missed, jnp.arange(n, dtype=jnp.int32)[:, None], n)  # [N, W]
        token = jnp.take_along_axis(cache.tokens, jnp.minimum(position, s - 1), axis=1)
        kv = self._forward(param_leaves, cache.kv, token.reshape(-1), position.reshape(-1),
                           slot.reshape(-1))
        # A slot behind moves up by the window, never past what is committed; a slot reset
        # for a new request (seq_len 0 until its prefill sets both) stays.
        length = jnp.where(cache.length < seq_len, jnp.minimum(cache.length + window, seq_len),
                           cache.length)
        return DraftLMCache(kv, cache.tokens, length)

    def draft(self, param_leaves, cache, *, last_token, seq_len, drafting, depth, max_depth,
              target_embed, sampling=None):
        model = self.module(param_leaves)
        num_slots = last_token.shape[0]
        slots = jnp.where(drafting, jnp.arange(num_slots, dtype=jnp.int32), num_slots)

        def step(kv, token, k):
            # Feed the token at seq_len + k (k = 0 is the bonus), predict the one after.
            position = seq_len + k
            out = model(token, position, slots, kv)
            draft = self._draw(out.logits, position + 1, slots, sampling)
            return out.cache, self._corrupt(draft, position + 1, slots)

        # Drafted tokens' cache entries lie at or past seq_len: the next commit overwrites
        # them with the verified tokens.
        kv, proposal = chain(step, cache.kv, last_token, depth=depth, max_depth=max_depth,
                             support=support(sampling))
        return cache._replace(kv=kv), proposal

    def _keys(self, slots, position, stream: int):
        base = jax.random.fold_in(jax.random.key(self.seed), stream)
        return jax.vmap(lambda s, p: jax.random.fold_in(jax.random.fold_in(base, s), p))(
            slots, position)

    def _draw(self, logits, position, slots, sampling) -> Draw:
        """The request's draw (sampling.draw_proposal); rows it drafts deterministically (all
        rows without `sampling`, greedy requests' rows with it) sample at the drafter's own
        temperature with its own keys when that is set: randomness independent of the
        target's, so each such draft is a point mass given those keys."""
        draw = draw_proposal(logits, position, sampling)
        if self.temperature == 0.0:
            return draw
        scaled = logits / self.temperature
        token = jax.vmap(jax.random.categorical)(self._keys(slots, position, 1), scaled)
        probs = jax.nn.softmax(scaled, axis=-1)
        conf = jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0]
        own = Draw(token.astype(jnp.int32), conf, *point_mass(token, draw.q_ids.shape[-1]))
        if sampling is None:
            return own
        deterministic = sampling.temperature <= 0.0
        return Draw(*(jnp.where(deterministic.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
                      for a, b in zip(own, draw)))

    def _corrupt(self, draw: Draw, position, slots) -> Draw:
        """Replaces a draft, with probability corrupt_rate (or from corrupt_from on), by the
        token a random shift away - and its distribution's support by the same shift, so the
        draft is still a draw from the distribution returned with it."""
        if self.corrupt_rate == 0.0 and self.corrupt_from is None:
            return draw
        vocab = self.config.vocab_size
        keys = self._keys(slots, position, 0)
        u, shift = jax.vmap(lambda k: (jax.random.uniform(k),
                                       jax.random.randint(jax.random.fold_in(k, 1), (), 1, vocab)))(keys)
        corrupt = u < self.corrupt_rate
        if self.corrupt_from is not None:  # a drafter that goes bad late in every sequence
            corrupt |= position >= self.corrupt_from
        token = jnp.where(corrupt, (draw.token + shift) % vocab, draw.token).astype(jnp.int32)
        moved = corrupt[:, None] & (draw.q_ids >= 0)
        q_ids = jnp.where(moved, (draw.q_ids + shift[:, None]) % vocab, draw.q_ids)
        return draw._replace(token=token, q_ids=q_ids.astype(jnp.int32))
