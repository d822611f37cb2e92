"""The device-resident batch: per-slot state, the writes that change it, and what comes back.

Everything a decode step needs about a request lives on the device, indexed by slot: its
sampling values, seed, stop ids, remaining allowance, committed length, last token and the
drafter's current proposal. The host writes a slot only when a request is admitted into it or
leaves it (`SlotRows`, a scatter of the changed slots), so a steady-state decode step takes no
per-request input at all: host-to-device traffic is O(changed slots), not O(N).

The device decides which slots decode (`active`): a slot turns active when its prompt is
prefilled and inactive when it emits a stop id or exhausts its allowance, so a step in flight
never decodes a request the host has not yet seen finish.

Axis legend: N slots, K max draft depth, S stop ids per slot, U written slots, T prefill rows,
C prompts completing per prefill step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

MAX_STOP_IDS = 16  # stop ids per request (EOS included) the device checks inside a span


class SlotState(NamedTuple):
    """Per-slot device state carried (donated) from step to step."""

    seq_len: jax.Array  # [N] i32: tokens whose target KV is committed
    last_token: jax.Array  # [N] i32: newest token, its KV not yet in the cache
    active: jax.Array  # [N] bool: decodes in the next decode step
    remaining: jax.Array  # [N] i32: tokens the request may still emit
    temperature: jax.Array  # [N] f32 (0 = greedy)
    top_k: jax.Array  # [N] i32 (0 = off)
    top_p: jax.Array  # [N] f32 (1 = off)
    seed: jax.Array  # [N] u32
    stop_ids: jax.Array  # [N, S] i32, -1 padded
    draft_tokens: jax.Array  # [N, K] i32: the current proposal (first proposal_len valid)
    draft_conf: jax.Array  # [N, K] f32: the fill's rank of each draft (sampling.Draw.conf)
    proposal_len: jax.Array  # [N] i32
    drafting: jax.Array  # [N] bool: slots the draft step after this verify proposes for
    # The distribution each draft was drawn from (probabilistic verification; M = 0 with
    # exact match): [N, K, M] target ids (-1 unused) and their probabilities.
    draft_q_ids: jax.Array
    draft_q_probs: jax.Array

    def sampling(self, slot: jax.Array):
        """The sampling values of `slot` [R] -> (temperature, top_k, top_p, seed), each [R]."""
        return self.temperature[slot], self.top_k[slot], self.top_p[slot], self.seed[slot]

    @classmethod
    def empty(cls, num_slots: int, max_depth: int, support: int = 0) -> "SlotState":
        n, k = num_slots, max(max_depth, 1)
        zeros = lambda dtype, *shape: jnp.zeros((n, *shape), dtype)  # noqa: E731
        return cls(seq_len=zeros(jnp.int32), last_token=zeros(jnp.int32),
                   active=zeros(jnp.bool_), remaining=zeros(jnp.int32),
                   temperature=zeros(jnp.float32), top_k=zeros(jnp.int32),
                   top_p=jnp.ones((n,), jnp.float32), seed=zeros(jnp.uint32),
                   stop_ids=jnp.full((n, MAX_STOP_IDS), -1, jnp.int32),
                   draft_tokens=zeros(jnp.int32, k), draft_conf=zeros(jnp.float32, k),
                   proposal_len=zeros(jnp.int32), drafting=zeros(jnp.bool_),
                   draft_q_ids=jnp.full((n, k, support), -1, jnp.int32),
                   draft_q_probs=zeros(jnp.float32, k, support))


class SlotRows(NamedTuple):
    """Host-built values of the slots that change hands this step (numpy, [U] unless noted).

    An admitted request's row carries its sampling values and allowance; a leaving slot's row
    carries defaults (inactive). Padding rows have slot = N, so the scatter drops them.
    """

    slot: np.ndarray  # i32
    temperature: np.ndarray  # f32
    top_k: np.ndarray  # i32
    top_p: np.ndarray  # f32
    seed: np.ndarray  # u32
    stop_ids: np.ndarray  # [U, S] i32
    remaining: np.ndarray  # i32

    @classmethod
    def empty(cls, size: int, num_slots: int) -> "SlotRows":
        return cls(slot=np.full((size,), num_slots, np.int32),
                   temperature=np.zeros((size,), np.float32), top_k=np.zeros((size,), np.int32),
                   top_p=np.ones((size,), np.float32), seed=np.zeros((size,), np.uint32),
                   stop_ids=np.full((size, MAX_STOP_IDS), -1, np.int32),
                   remaining=np.zeros((size,), np.int32))

    @classmethod
    def pack(cls, writes, size: int, num_slots: int) -> "SlotRows":
        """The rows of `writes` ((slot, admitted request or None for a slot an abort left)
        pairs), padded to `size`: an admitted request's sampling values, seed, stop ids and
        allowance; a left slot's defaults."""
        rows = cls.empty(size, num_slots)
        for i, (slot, request) in enumerate(writes):
            rows.slot[i] = slot
            if request is not None:
                p = request.params
                rows.temperature[i], rows.top_k[i], rows.top_p[i] = (p.temperature, p.top_k,
                                                                      p.top_p)
                rows.seed[i] = request.seed
                stops = sorted(request.stop_ids)
                rows.stop_ids[i, :len(stops)] = stops
                rows.remaining[i] = request.allowance
        return rows


def write_slots(state: SlotState, rows: SlotRows) -> SlotState:
    """Scatters admitted / leaving slots into the state; every written slot starts inactive,
    with no committed tokens and no proposal (its prefill activates it)."""
    at = rows.slot  # [U]; N on padding rows

    def put(x, value):
        return x.at[at].set(jnp.asarray(value, x.dtype), mode="drop")

    return state._replace(
        seq_len=put(state.seq_len, 0), active=put(state.active, False),
        remaining=put(state.remaining, rows.remaining),
        temperature=put(state.temperature, rows.temperature), top_k=put(state.top_k, rows.top_k),
        top_p=put(state.top_p, rows.top_p), seed=put(state.seed, rows.seed),
        stop_ids=put(state.stop_ids, rows.stop_ids), proposal_len=put(state.proposal_len, 0),
        drafting=put(state.drafting, False))


class PrefillInputs(NamedTuple):
    """Host-built rows of one prefill step (numpy): prompt chunks, padded to a bucket of T rows.

    The only per-step input the host builds; decode steps take none.
    """

    row_slot: np.ndarray  # [T] i32, padding rows = N (their cache writes are dropped)
    row_pos: np.ndarray  # [T] i32
    row_token: np.ndarray  # [T] i32
    row_next_token: np.ndarray  # [T] i32: x_{p+1} where it is a prompt token (drafter input)
    sample_row: np.ndarray  # [C] i32: last row of each completing prompt (0 on padding)
    sample_slot: np.ndarray  # [C] i32: its slot; N on padding

    @classmethod
    def empty(cls, rows: int, num_slots: int, replicas: int = 1) -> "PrefillInputs":
        """All padding. With D data-parallel replicas the arrays are D blocks, one per
        replica (rows / D rows, up to min(rows, N) / D completing prompts), whose slots and
        sample rows count within the replica (its N / D slots; padding N / D)."""
        local = num_slots // replicas
        completing = min(rows // replicas, local) * replicas
        return cls(row_slot=np.full((rows,), local, np.int32),
                   row_pos=np.zeros((rows,), np.int32), row_token=np.zeros((rows,), np.int32),
                   row_next_token=np.zeros((rows,), np.int32),
                   sample_row=np.zeros((completing,), np.int32),
                   sample_slot=np.full((completing,), local, np.int32))

    @staticmethod
    def rows_needed(chunks, num_slots: int, replicas: int = 1) -> int:
        """Rows the prompt chunks (scheduler.PrefillChunk) take: each replica's block is as
        wide as the busiest replica's chunks (`pack`)."""
        held = np.zeros(replicas, int)  # prompt rows per replica
        for chunk in chunks:
            held[chunk.request.slot // (num_slots // replicas)] += chunk.length
        return replicas * int(held.max())

    @classmethod
    def pack(cls, chunks, rows: int, num_slots: int, replicas: int = 1
             ) -> tuple["PrefillInputs", np.ndarray]:
        """The rows of prompt chunks in a bucket of `rows` (>= rows_needed) -> (inputs, where
        each completing chunk's first token sits among the step's samples [completing chunks],
        in `chunks` order). Each replica's chunks go to its own block (`empty`), its slots
        counted within it."""
        d, per = replicas, num_slots // replicas
        inputs = cls.empty(rows, num_slots, d)
        width, samples = rows // d, len(inputs.sample_row) // d  # each replica's block
        row = np.arange(d) * width  # next free row of each replica's block
        completing = np.arange(d) * samples  # next free sample of each
        where = []
        for chunk in chunks:
            request = chunk.request
            r, slot = divmod(request.slot, per)
            start, end, stop = row[r], row[r] + chunk.length, chunk.start + chunk.length
            inputs.row_slot[start:end] = slot
            inputs.row_pos[start:end] = np.arange(chunk.start, stop)
            inputs.row_token[start:end] = request.prompt_token_ids[chunk.start:stop]
            nxt = request.prompt_token_ids[chunk.start + 1:stop + 1]  # x_{p+1} where known
            inputs.row_next_token[start:start + len(nxt)] = nxt
            if chunk.completes_prompt:
                inputs.sample_row[completing[r]] = end - 1 - r * width
                inputs.sample_slot[completing[r]] = slot
                where.append(completing[r])
                completing[r] += 1
            row[r] = end
        return inputs, np.array(where, int)


class Readback(NamedTuple):
    """Column layout of a decode step's packed readback, one int32 row per slot: [N, K+1+5].

    One small array comes back per step (copied to the host asynchronously as soon as the step
    is dispatched); the host slices it with these column indices.
    """

    width: int  # K+1 token columns

    @property
    def emitted(self) -> int:  # tokens to stream (after stop ids and the allowance)
        return self.width

    @property
    def accepted(self) -> int:  # drafts accepted
        return self.width + 1

    @property
    def verified(self) -> int:  # drafts verified (the fill's length)
        return self.width + 2

    @property
    def offered(self) -> int:  # drafts the proposal held
        return self.width + 3

    @property
    def finished(self) -> int:  # 1: a stop id or the allowance ended the request
        return self.width + 4

    @property
    def columns(self) -> int:
        return self.width + 5

    def proposal_outcomes(self, rows: np.ndarray, depth: int, *, given: np.ndarray,
                          room: np.ndarray, short_proposals: bool
                          ) -> tuple[np.ndarray, np.ndarray | None]:
        """(had_proposal, uncensored or None) [R] for the planner's statistics
        (StepObservation), from read-back rows [R, columns] of a step that verified proposals
        of `depth`.

        A request held a proposal when it drafted (offered > 0). With a drafter that may
        propose short (`Drafter.short_proposals`: n-gram lookup), a request the draft run
        served (`given` [R]) had its try even when the drafter found nothing, and a proposal
        shorter than `depth` but verified whole is uncensored: its missing drafts count as
        rejected. Otherwise the survival is conditional on a match, and a workload that
        rarely repeats itself looks like one that always does (math, c=16: dynamic n-gram
        drafted every step, at 0.88x plain). A request its allowance cut (`room` [R]: drafts
        it could still use, below `depth`) stays censored."""
        offered, verified = rows[:, self.offered], rows[:, self.verified]
        if not short_proposals or depth == 0:
            return offered > 0, None
        whole = (verified >= offered) & ((offered == depth) | (room >= depth))
        return (offered > 0) | given, whole


def pack_readback(out_tokens, emitted, accepted, verified, offered, finished) -> jax.Array:
    """[N, K+1] tokens and five [N] counts -> one [N, K+1+5] int32 array (see Readback)."""
    counts = jnp.stack([emitted, accepted, verified, offered, finished.astype(jnp.int32)],
                       axis=1).astype(jnp.int32)  # [N, 5]
    return jnp.concatenate([out_tokens.astype(jnp.int32), counts], axis=1)
