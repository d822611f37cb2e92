"""Eagle3 as a drafter: a commit forward over the verified rows, then recurrent draft steps.

Alignment (reference/checkpoint-formats.md §2.2, EAGLE's convention): the draft row at position
p reads (target features h_p, token x_{p+1}) and predicts x_{p+2}. For a verify row the next
token is the target's own token sampled there, so the commit forward writes the draft KV of
every verified row in one pass - rows past the accepted prefix write stale entries beyond the
new sequence length that later steps overwrite - and the row of each slot's bonus token
yields its first draft. Each further step reads the previous step's carried state instead of
target features, at the next position.
"""

from __future__ import annotations

import jax.numpy as jnp

from lightspec_jax.models import Eagle3, KVCache

from .base import Drafter, DraftRows, chain, top1


class Eagle3Drafter(Drafter):
    def __init__(self, model: Eagle3):
        super().__init__(model)
        self.config = model.config
        self.aux_layers = tuple(model.config.aux_layer_ids)
        self._own_embed = model.embed is not None
        self._dtype = model.dtype

    def new_cache(self, *, num_slots: int, cache_len: int) -> KVCache:
        cfg = self.config
        return KVCache.init(num_layers=1, num_slots=num_slots, max_len=cache_len,
                            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                            dtype=self._dtype)

    def _embed(self, target_embed):
        # A drafter that ships its own embedding uses it (vLLM's rule); else the target's.
        return None if self._own_embed else target_embed

    def prefill(self, param_leaves, cache, rows: DraftRows, *, target_embed):
        model = self.module(param_leaves)
        return model(rows.next_token, rows.hidden, rows.position, rows.slot, cache,
                     embed=self._embed(target_embed), from_features=True,
                     logits_rows=jnp.zeros((1,), jnp.int32)).cache

    def commit(self, param_leaves, cache, rows: DraftRows, *, tail_row, bonus, new_seq_len,
               stepped, target_embed):
        model = self.module(param_leaves)
        num_slots = bonus.shape[0]
        out = model(rows.next_token, rows.hidden, rows.position, rows.slot, cache,
                    embed=self._embed(target_embed), from_features=True,
                    logits_rows=tail_row)  # logits [N, Vd], state [N, H]
        draft, conf = top1(out.logits)  # [N] draft-vocab ids
        slots = jnp.where(stepped, jnp.arange(num_slots, dtype=jnp.int32), num_slots)
        return out.cache, (model.draft_to_target(draft), conf, out.state, new_seq_len, slots)

    def keep_current(self, param_leaves, cache, rows: DraftRows, *, target_embed):
        # One layer: a row's K/V follow from its own inputs, so the writes cost a fraction
        # of the forward (no attention, MLP or draft logits).
        return self.module(param_leaves).write_cache(
            rows.next_token, rows.hidden, rows.position, rows.slot, cache,
            embed=self._embed(target_embed))

    def draft(self, param_leaves, cache, carry, *, depth, max_depth, target_embed):
        model = self.module(param_leaves)
        embed = self._embed(target_embed)
        first, conf, state, new_seq_len, slots = carry

        def step(carry, token, k):
            cache, state = carry
            # Draft k sits at position new_seq_len + k; its row is one earlier (EAGLE's offset).
            out = model(token, state, new_seq_len - 1 + k, slots, cache, embed=embed,
                        from_features=False)
            nxt, c = top1(out.logits)
            return (out.cache, out.state), model.draft_to_target(nxt), c

        (cache, _), proposal = chain(step, (cache, state), first, depth=depth,
                                     max_depth=max_depth, first=(first, conf))
        return cache, proposal
