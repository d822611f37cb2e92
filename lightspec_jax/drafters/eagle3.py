"""Eagle3 as a drafter: a commit forward over the verified rows, then recurrent draft steps.

Alignment (reference/checkpoint-formats.md §2.2, EAGLE's convention): the draft row at position
p reads (target features h_p, token x_{p+1}) and predicts x_{p+2}. For a verify row the next
token is the target's own token sampled there, so the commit writes the draft KV of every
verified row in one pass (K/V only: one layer's K/V follow from the row's own inputs) - rows
past the accepted prefix write stale entries beyond the new sequence length that later steps
overwrite - and keeps each slot's tail-row features. Drafting then runs the full layer for the
tail row alone (N rows, not B), which yields the first draft; each further step reads the
previous step's carried state instead of target features, at the next position.
"""

from __future__ import annotations

import jax.numpy as jnp

from typing import NamedTuple

import jax

from lightspec_jax.models import Eagle3, KVCache

from ..sampling import draw_proposal
from .base import Drafter, DraftRows, chain, support


class Eagle3Cache(NamedTuple):
    kv: KVCache  # [1, N, S, G, D] the one layer's K/V
    tail_features: jax.Array  # [N, A*Ht] target features of each slot's last committed row


class Eagle3Drafter(Drafter):
    method = "eagle3"

    def __init__(self, model: Eagle3):
        super().__init__(model)
        self.config = model.config
        self.aux_layers = tuple(model.config.aux_layer_ids)
        self._own_embed = model.embed is not None
        self._dtype = model.dtype

    def new_cache(self, *, num_slots: int, cache_len: int) -> Eagle3Cache:
        cfg = self.config
        kv = KVCache.init(num_layers=1, num_slots=num_slots, max_len=cache_len,
                          num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=self._dtype)
        return Eagle3Cache(kv, jnp.zeros((num_slots, cfg.feature_size), self._dtype))

    def _embed(self, target_embed):
        # A drafter that ships its own embedding uses it (vLLM's rule); else the target's.
        return None if self._own_embed else target_embed

    def prefill(self, param_leaves, cache, rows: DraftRows, *, target_embed):
        kv = self.module(param_leaves).write_cache(
            rows.next_token, rows.hidden, rows.position, rows.slot, cache.kv,
            embed=self._embed(target_embed))
        # A prompt's last row needs no features kept: its first decode step verifies it again.
        return cache._replace(kv=kv)

    def commit(self, param_leaves, cache, rows: DraftRows, *, tail_row, target_embed):
        kv = self.module(param_leaves).write_cache(
            rows.next_token, rows.hidden, rows.position, rows.slot, cache.kv,
            embed=self._embed(target_embed))
        return Eagle3Cache(kv, rows.hidden[tail_row].astype(cache.tail_features.dtype))

    def draft(self, param_leaves, cache, *, last_token, seq_len, drafting, depth, max_depth,
              target_embed, sampling=None):
        model = self.module(param_leaves)
        embed = self._embed(target_embed)
        num_slots = last_token.shape[0]
        slots = jnp.where(drafting, jnp.arange(num_slots, dtype=jnp.int32), num_slots)
        # Draft k is the token at position seq_len + 1 + k, predicted by the row at
        # seq_len - 1 + k (EAGLE's offset: row p reads x_{p+1}, predicts x_{p+2}). Row 0
        # is the tail row again, now through the whole layer: (h_tail, bonus) -> draft 0.
        out = model(last_token, cache.tail_features, seq_len - 1, slots, cache.kv, embed=embed,
                    from_features=True)
        first = draw_proposal(out.logits, seq_len + 1, sampling, model.draft_to_target)

        def step(carry, token, k):
            kv, state = carry
            out = model(token, state, seq_len - 1 + k, slots, kv, embed=embed,
                        from_features=False)
            draw = draw_proposal(out.logits, seq_len + 1 + k, sampling,  # draft k's position
                                 model.draft_to_target)
            return (out.cache, out.state), draw

        (kv, _), proposal = chain(step, (out.cache, out.state), last_token, depth=depth,
                                  max_depth=max_depth, support=support(sampling), first=first)
        return cache._replace(kv=kv), proposal
