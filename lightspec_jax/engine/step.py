"""The device steps, as pure functions: prefill, the decode step (verify, then draft), and
slot writes.

One decode step, all on the device, in one executable per verify bucket B and one per draft
depth d, neither with device-side control flow (on a GPU a `lax.cond` or a loop with a traced
trip count reads a predicate back to the host, which stalls the dispatch of everything after
it until the device gets there, and with it the overlap of host and device work):

    fill     B verify rows: each active slot's last token plus its highest prefix-survival
             drafts (pallas_kernels.fill)
    target   the target's forward over the B flat rows (its cost follows B, not N x (K+1)),
             then the target's own token per row: argmax, or a sample keyed by (seed, position)
    verify   accepted prefix + bonus token per slot (the verifier: exact match by default)
    commit   seq_len += accepted + 1; stop ids and the allowance cut what is emitted and end
             requests on the device (pallas_kernels.commit)
    commit'  the drafter's cache writes for the verified rows (and what drafting starts from);
             at the floor, for a drafter that catches up, only a record of the rows' tokens
  then, in the draft executable of depth d (not run at depth 0, the planner's floor):
    draft    d draft tokens per slot that stepped and goes on
  and, before a step that commits after floor steps that only recorded:
    catch-up the drafter's forward over the positions it missed (a window W per executable)

Plain decoding is the same step without a drafter: no proposal, one row per active slot.
Sampling takes a static SampleMode (the host knows its requests' parameters).
Axis legend: N slots, K max draft depth, B verify rows, T prefill rows, C completing prompts,
V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lightspec_jax.models import KVCache, Qwen3
from lightspec_jax.pallas_kernels import commit, fill

from ..drafters import Drafter, DraftRows
from ..sampling import SampleMode, point_mass, sample
from .batch import PrefillInputs, SlotState, pack_readback


def prefill(target: Qwen3, drafter: Drafter | None, d_leaves, cache: KVCache, dcache,
            state: SlotState, inputs: PrefillInputs, *, mode: SampleMode,
            row_tile: int | None = None):
    """Prompt chunks through the target (and the drafter); each completing prompt samples its
    first token and its slot turns active (unless that token already ends it). row_tile: the
    target's batch-invariant tiling (Qwen3.__call__), None by default.

    Returns (cache, dcache, state, first tokens [C]).
    """
    n = state.seq_len.shape[0]
    aux = drafter.aux_layers if drafter is not None else ()
    out = target(inputs.row_token, inputs.row_pos, inputs.row_slot, cache,
                 logits_rows=inputs.sample_row, aux_layers=aux,
                 row_tile=row_tile)  # logits [C, V]
    at = inputs.sample_slot  # [C]; N on padding (scatters drop it)
    slot = jnp.clip(at, 0, n - 1)
    prompt_len = inputs.row_pos[inputs.sample_row] + 1  # [C]: the first token's position
    tokens = sample(out.logits, *state.sampling(slot), prompt_len, mode)  # [C]
    stops = jnp.any(state.stop_ids[slot] == tokens[:, None], axis=1)  # [C]
    remaining = state.remaining[slot] - 1

    def put(x, value):
        return x.at[at].set(value.astype(x.dtype), mode="drop")

    state = state._replace(seq_len=put(state.seq_len, prompt_len),
                           last_token=put(state.last_token, tokens),
                           remaining=put(state.remaining, remaining),
                           active=put(state.active, ~stops & (remaining > 0)),
                           proposal_len=put(state.proposal_len, jnp.zeros_like(at)),
                           drafting=put(state.drafting, jnp.zeros_like(at, bool)))
    if drafter is not None:
        # x_{p+1} of each prompt row: the next prompt token, or the token sampled here.
        by_slot = jnp.zeros((n + 1,), jnp.int32).at[at].set(tokens)  # [N+1]
        rows = inputs.row_slot.shape[0]
        is_last = jnp.zeros((rows,), bool).at[jnp.where(at < n, inputs.sample_row, rows)].set(
            True, mode="drop")  # [T]
        next_token = jnp.where(is_last, by_slot[inputs.row_slot], inputs.row_next_token)
        draft_rows = DraftRows(token=inputs.row_token, next_token=next_token,
                               hidden=out.aux_hidden, position=inputs.row_pos,
                               slot=inputs.row_slot)
        dcache = drafter.prefill(d_leaves, dcache, draft_rows, target_embed=target.embed[...])
    return out.cache, dcache, state, tokens


def decode(target: Qwen3, drafter: Drafter | None, verifier, d_leaves, cache: KVCache, dcache,
           state: SlotState, extra, *, num_rows: int, mode: SampleMode,
           row_tile: int | None = None, commit_drafter: bool = True):
    """fill -> target over B rows -> verify -> commit -> the drafter's commit. row_tile: as
    for `prefill`. commit_drafter False (a floor step, drafters that catch up): the drafter
    only records the rows, and `catch_up` must run before the next step that commits.

    Returns (cache, dcache, state, readback [N, K+1+5] (batch.Readback), verified proposal's
    confidences [N, K]). `state.drafting` marks the slots a following `draft` proposes for.
    """
    n, k = state.draft_tokens.shape
    active = state.active
    # A slot emits at most `remaining` tokens, the bonus one included: drafts past
    # remaining - 1 cannot commit, so the fill never spends a row on them.
    usable = jnp.minimum(state.proposal_len, jnp.maximum(state.remaining - 1, 0))  # [N]
    layout = fill(verifier.fill_confidence(state, extra), usable, active, num_rows=num_rows)
    slot = jnp.clip(layout.row_slot, 0, n - 1)  # [B]; padding rows read slot N-1
    offset = layout.row_offset  # [B]
    draft_at = state.draft_tokens[slot, jnp.clip(offset - 1, 0, k - 1)]
    row_token = jnp.where(offset == 0, state.last_token[slot], draft_at)  # [B]
    row_pos = state.seq_len[slot] + offset  # [B]

    aux = drafter.aux_layers if drafter is not None else ()
    out = target(row_token, row_pos, layout.row_slot, cache, aux_layers=aux,
                 row_tile=row_tile)
    # Each row's token: the target's own (exact match), or the outcome of its draft's
    # rejection test (probabilistic verification); committed only up to the first miss.
    target_tokens = verifier.row_tokens(out.logits, state, layout, slot, row_pos, mode)  # [B]
    accepted, out_tokens, num_new = verifier.verify(target_tokens, layout, state.draft_tokens,
                                                    extra)
    done = commit(out_tokens, num_new, accepted, layout, state.seq_len, active, state.stop_ids,
                  state.remaining)
    stepped = active & layout.slot_valid  # [N]
    readback = pack_readback(out_tokens, done.num_emitted, accepted, layout.lengths,
                             jnp.where(stepped, state.proposal_len, 0), done.finished)
    verified_conf = state.draft_conf
    state = state._replace(
        seq_len=done.new_seq_len,
        last_token=jnp.where(stepped, done.new_last_token, state.last_token),
        remaining=state.remaining - done.num_emitted,
        active=active & ~done.finished,
        proposal_len=jnp.where(stepped, 0, state.proposal_len),
        drafting=stepped & ~done.finished)
    if drafter is not None:
        rows = DraftRows(token=row_token, next_token=target_tokens, hidden=out.aux_hidden,
                         position=row_pos, slot=layout.row_slot)
        if commit_drafter:
            dcache = drafter.commit(d_leaves, dcache, rows, tail_row=done.tail_row,
                                    target_embed=target.embed[...])
        else:
            dcache = drafter.record(d_leaves, dcache, rows)
    return out.cache, dcache, state, readback, verified_conf


def catch_up(drafter: Drafter, d_leaves, dcache, state: SlotState, *, window: int):
    """The drafter's forward over up to `window` (static) positions per slot that floor steps
    only recorded, before state.seq_len. Returns dcache."""
    return drafter.catch_up(d_leaves, dcache, seq_len=state.seq_len, window=window)


def draft(target_embed: jax.Array, drafter: Drafter, verifier, d_leaves, dcache,
          state: SlotState, *, depth: int):
    """`depth` (static) draft tokens for each slot the last verify left drafting (the
    target's embedding [V, H] is all of the target it reads). The verifier says how sampled
    requests' drafts are drawn (argmax, coupled to the target's noise, or from q for
    rejection sampling, whose q the state then keeps: M > 0 entries per draft).

    Returns (dcache, state) with those slots' proposals.
    """
    k, m = state.draft_q_ids.shape[1:]
    dcache, proposal = drafter.draft(d_leaves, dcache, last_token=state.last_token,
                                     seq_len=state.seq_len, drafting=state.drafting,
                                     depth=depth, max_depth=k, target_embed=target_embed,
                                     sampling=verifier.proposal_sampling(
                                         state, target_embed.shape[0]))
    q_ids, q_probs = proposal.q_ids, proposal.q_probs
    if q_ids is None or q_ids.shape[-1] != m:  # deterministic drafts: point masses
        q_ids, q_probs = point_mass(proposal.tokens, m)
    keep = state.drafting[:, None]
    length = depth if proposal.length is None else proposal.length
    return dcache, state._replace(
        draft_tokens=jnp.where(keep, proposal.tokens, state.draft_tokens),
        draft_conf=jnp.where(keep, proposal.confidence, state.draft_conf),
        draft_q_ids=jnp.where(keep[..., None], q_ids, state.draft_q_ids),
        draft_q_probs=jnp.where(keep[..., None], q_probs, state.draft_q_probs),
        proposal_len=jnp.where(state.drafting, length, state.proposal_len).astype(jnp.int32),
        drafting=jnp.zeros_like(state.drafting))
