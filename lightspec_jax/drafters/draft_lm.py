"""A standalone draft language model (a small Qwen3 with its own KV cache) as the drafter.

The vanilla form of speculative decoding (a small model of the same family drafting for a large
one). It needs no target features. Its cache holds x_p at p like the target's: the commit
forward re-reads the verify rows, then drafting starts from the bonus token at new_seq_len.

`temperature` > 0 samples the drafts instead of taking the argmax (keys from the drafter's
own seed, slot and position - never the request's seed). `corrupt_rate` replaces each drafted
token, with that probability, by another one (keyed likewise, so runs are reproducible), and
`corrupt_from` replaces every token drafted for a position at or past it (a drafter that is
right early in a request and wrong later). With the target's own weights as the draft model
this gives a drafter that is right most of the time but not always: long accepted spans, full
acceptance and bonus tokens, next to partial rejections - what the lossless tests need.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lightspec_jax.models import KVCache, Qwen3

from ..sampling import Draw, draw_proposal, point_mass
from .base import Drafter, DraftRows, chain, support


class DraftLMDrafter(Drafter):
    method = "draft_lm"

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

    def new_cache(self, *, num_slots: int, cache_len: int) -> KVCache:
        cfg = self.config
        return KVCache.init(num_layers=cfg.num_layers, num_slots=num_slots, max_len=cache_len,
                            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                            dtype=self.param_leaves[0].dtype)

    def prefill(self, param_leaves, cache, rows: DraftRows, *, target_embed):
        model = self.module(param_leaves)
        out = model(rows.token, rows.position, rows.slot, cache,
                    logits_rows=jnp.zeros((1,), jnp.int32))
        return out.cache

    def commit(self, param_leaves, cache, rows: DraftRows, *, tail_row, target_embed):
        # The verify rows' inputs, so the accepted prefix is in the draft model's cache: a
        # forward through every layer (each layer's K/V need the one below), logits of one row.
        # Drafting starts from the bonus token, which the slot state holds: nothing to keep.
        return self.module(param_leaves)(rows.token, rows.position, rows.slot, cache,
                                         logits_rows=jnp.zeros((1,), jnp.int32)).cache

    def draft(self, param_leaves, cache, *, last_token, seq_len, drafting, depth, max_depth,
              target_embed, sampling=None):
        model = self.module(param_leaves)
        num_slots = last_token.shape[0]
        slots = jnp.where(drafting, jnp.arange(num_slots, dtype=jnp.int32), num_slots)

        def step(cache, token, k):
            # Feed the token at seq_len + k (k = 0 is the bonus), predict the one after.
            position = seq_len + k
            out = model(token, position, slots, cache)
            draft = self._draw(out.logits, position + 1, slots, sampling)
            return out.cache, self._corrupt(draft, position + 1, slots)

        # Drafted tokens' cache entries lie at or past seq_len: the next commit overwrites
        # them with the verified tokens.
        return chain(step, cache, last_token, depth=depth, max_depth=max_depth,
                     support=support(sampling))

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
