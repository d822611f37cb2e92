"""DFlash as a drafter: context K/V written at every verify, one block forward per draft.

Alignment (z-lab/dflash `model/dflash.py` spec_generate; reference/checkpoint-formats.md §3):
the context holds the target's features of committed positions only, p < seq_len, and the
block starts with the bonus token at seq_len, whose own features are not known until the next
verify. So `prefill` writes the prompt rows' context and `commit` writes the B verify rows':
the accepted rows (offsets 0..accepted) are exactly the positions seq_len .. new_seq_len - 1,
whose features are final (the target is causal, and every token they depend on is committed);
rows past the accepted prefix land at >= new_seq_len, stale entries that the block and later
commits overwrite before anything reads them. Drafting is then one forward of
[bonus, mask x (P-1)] per slot; block row i (i = 1..d) is draft i, for position seq_len + i.

The commit needs no attention (a context row's K/V depend on its own features alone), so it
costs a projection per verify row and keeps the cache current at every depth, 0 included:
the planner's floor works as for Eagle3.

The target's lm_head reads the block out. The drafter keeps a reference to it (an untied
target's [H, V] head: the same device buffer, no copy) among its parameter leaves, so the
Drafter interface, which passes the target's embedding only, is unchanged; a tied target's
head is that embedding.

Axis legend: N slots, P block rows, d depth, K max depth, H hidden, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lightspec_jax.models import DFlash, KVCache, Qwen3

from ..sampling import draw_proposal
from .base import Drafter, DraftRows, Proposal

# The GPU attention kernel reads KV in blocks of 16 positions: cache lengths stay multiples.
_CACHE_GRANULE = 16


class TargetHead(nnx.Variable):
    """The target's lm_head kept by reference (not trained, not saved with the drafter)."""


class _WithHead(nnx.Module):
    def __init__(self, model: DFlash, head: jax.Array | None):
        self.model = model
        self.head = None if head is None else TargetHead(head)  # [H, V]; None: tied target


class DFlashDrafter(Drafter):
    kind = "parallel"
    method = "dflash"
    first_row = 1  # the block row of draft 1 (row 0 holds the bonus token)
    block_lead = 1  # a cut block: the bonus row, then one mask row per draft (block_rows)

    def __init__(self, model: DFlash, target: Qwen3):
        """model: the DFlash draft model; target: the Qwen3 it drafts for (its lm_head reads
        the block; its config is checked against the drafter's)."""
        model.config.check_target(target.config)
        super().__init__(_WithHead(model, None if target.lm_head is None
                                   else target.lm_head[...]))
        self.config = model.config
        self.aux_layers = model.config.aux_layers
        self.block_size = model.config.block_size
        self._dtype = model.dtype

    def new_cache(self, *, num_slots: int, cache_len: int) -> KVCache:
        """Context K/V per draft layer [L, N, S, G, D], with room past `cache_len` for a block
        drafted at the last committed position."""
        room = -(-self.block_size // _CACHE_GRANULE) * _CACHE_GRANULE
        cfg = self.config
        return KVCache.init(num_layers=cfg.num_layers, num_slots=num_slots,
                            max_len=cache_len + room, num_kv_heads=cfg.num_kv_heads,
                            head_dim=cfg.head_dim, dtype=self._dtype)

    def prefill(self, param_leaves, cache, rows: DraftRows, *, target_embed):
        return self.module(param_leaves).model.write_context(rows.hidden, rows.position,
                                                             rows.slot, cache)

    def commit(self, param_leaves, cache, rows: DraftRows, *, tail_row, target_embed):
        # Drafting starts from the bonus token and the committed length, both in the slot
        # state: nothing to keep but the context.
        return self.module(param_leaves).model.write_context(rows.hidden, rows.position,
                                                             rows.slot, cache)

    def block_rows(self, depth: int) -> int:
        """Rows of the block forward that drafts `depth` tokens: block_lead + depth when the
        drafter cuts its block (as PlannerSpec.block_rows prices it), else the whole block.
        Attention is not causal inside the block, so a truncated block's rows differ from the
        whole block's (the shipped drafter, trained on whole blocks of 8, accepts about as
        often either way: BENCHMARKS.md, "Thirteenth session"); a shorter block is a cheaper
        forward, which is what a dynamic engine's choice of depth buys with a block
        drafter."""
        return self.block_size if self.block_lead is None else self.block_lead + depth

    @property
    def block_depth(self) -> int:
        """Drafts one block forward yields: the most this drafter drafts per step."""
        return self.block_size - self.first_row

    def check_max_depth(self, k: int) -> None:
        """ValueError when K (num_speculative_tokens) exceeds the drafts of one block."""
        if k > self.block_depth:
            rule = "block_size" + (f" - {self.first_row}" if self.first_row else "")
            raise ValueError(f"num_speculative_tokens={k} exceeds what one block of the "
                             f"{type(self).__name__} drafts: at most {rule} = "
                             f"{self.block_depth}")

    def check_depth(self, depth: int, max_depth: int) -> None:
        limit = min(max_depth, self.block_depth)
        if not 1 <= depth <= limit:
            raise ValueError(f"depth must be in [1, {limit}] (max depth {max_depth}, block size "
                             f"{self.block_size} drafts at most {self.block_depth}), got "
                             f"{depth}")

    def draft(self, param_leaves, cache, *, last_token, seq_len, drafting, depth, max_depth,
              target_embed, sampling=None):
        self.check_depth(depth, max_depth)
        wrapped = self.module(param_leaves)
        n = last_token.shape[0]
        slots = jnp.where(drafting, jnp.arange(n, dtype=jnp.int32), n)  # [N]
        tokens = jnp.full((n, self.block_rows(depth)), self.config.mask_token_id, jnp.int32)
        tokens = tokens.at[:, 0].set(last_token)  # [N, P'] (P' = block_rows(depth))
        out = wrapped.model(tokens, seq_len, slots, cache, embed=target_embed)
        rows = out.hidden[:, self.first_row:self.first_row + depth]  # [N, d, H]
        return out.cache, self.read_out(wrapped, rows, last_token=last_token, seq_len=seq_len,
                                        max_depth=max_depth, target_embed=target_embed,
                                        sampling=sampling)

    @staticmethod
    def logits(wrapped, rows, target_embed):
        """The target's lm_head (its embedding when tied) over block rows [..., H] -> [..., V]
        f32."""
        if wrapped.head is None:
            return jnp.einsum("...h,vh->...v", rows, target_embed.astype(rows.dtype),
                              preferred_element_type=jnp.float32)
        return jnp.einsum("...h,hv->...v", rows, wrapped.head[...].astype(rows.dtype),
                          preferred_element_type=jnp.float32)

    def read_out(self, wrapped, rows, *, last_token, seq_len, max_depth, target_embed,
                 sampling):
        """The proposal [N, max_depth] from the drafting rows [N, d, H] of the block."""
        n, depth, h = rows.shape
        logits = self.logits(wrapped, rows.reshape(n * depth, h), target_embed)  # [N*d, V]
        # Block row i drafts position seq_len + i; each row is drawn on its own (the block
        # predicts every position from the context alone, so q of row i is its distribution).
        position = (seq_len[:, None] + jnp.arange(1, depth + 1)[None, :]).reshape(-1)
        per_row = None if sampling is None else sampling._replace(**{
            f: jnp.repeat(getattr(sampling, f), depth)
            for f in ("temperature", "top_k", "top_p", "seed", "round")})
        draw = draw_proposal(logits, position, per_row)  # [N*d] rows

        def shaped(x, fill=0):  # [N*d, ...] -> [N, max_depth, ...], `fill` past depth
            x = x.reshape((n, depth) + x.shape[1:])
            pad = [(0, 0), (0, max_depth - depth)] + [(0, 0)] * (x.ndim - 2)
            return jnp.pad(x, pad, constant_values=fill)

        return Proposal(shaped(draw.token), shaped(draw.conf), q_ids=shaped(draw.q_ids, -1),
                        q_probs=shaped(draw.q_probs))
