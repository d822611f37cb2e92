"""How a decode step turns the target's logits into accepted spans: an object the runner is
built with, so the core has no benchmark branch.

`ExactMatch` (the default) is lossless token for token: a draft is accepted when it equals
the target's own token (argmax, or the seeded sample at its position), so the output is what
plain decoding emits with the same seeds. `RejectionSampling` (probabilistic verification)
accepts a sampled request's draft x with probability min(1, p(x) / q(x)) and otherwise draws
from norm(max(0, p - q)): the output follows the target's distribution exactly, and a drafter
whose q resembles p gets more accepted than the one token the seeded sample allows.
`SyntheticAcceptance` is for benchmarks
of untrained or random-weight models: it draws each slot's accepted length and the fill's
confidences from a workload profile, so every device cost is real while the emitted tokens are
not the target's; every result that used it says so.

Axis legend: N slots, K max draft depth, B verify rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import jax
import jax.numpy as jnp

from lightspec_jax.pallas_kernels import verify

from ..sampling import (ACCEPT_STREAM, ProposalSampling, SampleMode, draw,
                        row_keys, sample, target_logits)


class ExactMatch:
    """Lossless exact-match verification (the production verifier)."""

    name = None  # nothing to label in results
    support = 0  # M: entries of each draft's distribution the slot state keeps (none)
    coupled_support = 0  # > 0: sampled requests' drafts are coupled draws (see __init__)

    def __init__(self, coupled_support: int = 0):
        """coupled_support > 0: sampled requests' drafts are drawn from the drafter's top
        coupled_support tokens with the target's own noise for their position
        (sampling.draw_proposal, coupled), so they hit the target's seeded sample more often
        than the argmax does; 0: drafts are the drafter's argmax."""
        self.coupled_support = coupled_support

    def empty_inputs(self, num_slots: int, max_depth: int):
        return ()

    def host_inputs(self, active: np.ndarray, verifies: bool = True):
        """Per-step host inputs for the slots marked in `active` [N] bool: none. verifies:
        whether the step may verify drafts (False: no slot holds a proposal)."""
        return ()

    def admit(self, slots: np.ndarray) -> None:
        pass

    def fill_confidence(self, state, extra):
        return state.draft_conf  # [N, K]

    def proposal_sampling(self, state, vocab: int) -> ProposalSampling | None:
        """How the next drafts are drawn (None: the drafter's argmax)."""
        if not self.coupled_support:
            return None
        return _proposal_sampling(state, self.coupled_support, vocab, coupled=True)

    def row_tokens(self, logits, state, layout, slot, row_pos, mode: SampleMode):
        """The token each verify row commits if the drafts before it are accepted -> [B]:
        here the target's own (argmax, or the sample keyed by seed and position row_pos + 1,
        the key plain decoding uses there). logits [B, V]; slot, row_pos [B]."""
        return sample(logits, *state.sampling(slot), row_pos + 1, mode)

    def verify(self, target_tokens, layout, draft_tokens, extra):
        """-> accepted [N], out_tokens [N, K+1], num_new [N] (pallas_kernels.verify)."""
        return verify(target_tokens, layout, draft_tokens)


def _proposal_sampling(state, support: int, vocab: int, *, coupled: bool) -> ProposalSampling:
    """Every slot's sampling values and round (its committed length) for the draft step."""
    return ProposalSampling(state.temperature, state.top_k, state.top_p, state.seed,
                            round=state.seq_len, support=support, vocab=vocab, coupled=coupled)


class RejectionSampling(ExactMatch):
    """Probabilistic verification (speculative rejection sampling) for sampled requests;
    greedy requests in the same batch keep exact match.

    Leviathan et al. 2023 (arXiv:2211.17192) and Chen et al. 2023 (arXiv:2302.01318): for a
    draft x drawn from q, accept with probability min(1, p(x)/q(x)), else draw from
    norm(max(0, p - q)); the token that results follows p whatever q is. p is the target's
    distribution after the request's temperature, top-k and top-p; q is what the drafter drew
    from (sampling.draw_proposal, kept in the slot state as M ids and probabilities). A row
    that tests no draft (the bonus row after the verified ones) keeps the target's own seeded
    sample, so a step that verifies nothing is plain decoding token for token.

    The per-row outcome is folded into the row's token - the accepted draft, or a residual
    draw that can never equal it (the residual is 0 at a rejected x) - so exact-match verify
    then yields exactly the accepted prefix and the bonus. All draws are keyed by (request
    seed, position[, round]): runs are reproducible, and a request's outcome does not depend on
    its batch, only on its own proposals and how many of them are verified.

    Why the budget must not anticipate (DSpark, Appendix A; reference/lightspec-algorithm.md,
    its appendix): if the rows were chosen after looking at the target's probabilities of the
    same step, or at q(x) of a drawn token, a tested draft would no longer be a draw from its q
    (it was tested because it came out well) and the output would tilt toward the drafter.
    Here B comes from statistics of finished steps, and the fill ranks drafts by survival
    products of confidences that are max q, known before each draw. The fill takes the top
    rows in one total order (score, then slot and offset: pallas_kernels/fill.py), and a
    slot's deeper drafts never outrank its shallower ones, so whether draft j is tested
    depends on its slot's drafts before j and on other slots - never on x_j or anything after
    it. Each tested draft is then a fresh draw from its q, and the rule above stays exact.
    """

    def __init__(self, support: int = 32):
        if not isinstance(support, int) or support < 1:
            raise ValueError(f"the proposal support must be an int >= 1, got {support!r}")
        self.support = support

    def proposal_sampling(self, state, vocab: int) -> ProposalSampling:
        """Sampled requests' drafts drawn from q with their own keys; q kept in the state."""
        return _proposal_sampling(state, self.support, vocab, coupled=False)

    def row_tokens(self, logits, state, layout, slot, row_pos, mode: SampleMode):
        if mode == SampleMode.GREEDY:  # every request greedy: exact match
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        temperature, top_k, top_p, seed = state.sampling(slot)  # [B] each
        scaled = target_logits(logits, temperature, top_k, top_p, mode)
        position = row_pos + 1
        own = draw(logits, scaled, temperature, seed, position)  # [B]
        k = state.draft_tokens.shape[1]
        offset = row_pos - state.seq_len[slot]  # [B] the row's offset in its slot's span
        column = jnp.clip(offset, 0, k - 1)
        tests = (layout.slot_valid[slot] & (offset < layout.lengths[slot])
                 & (temperature > 0.0))  # [B] rows whose token decides a sampled draft
        x = state.draft_tokens[slot, column]  # [B]
        round_ = state.seq_len[slot]
        outcome = rejection_outcome(
            jax.nn.softmax(scaled, axis=-1), x, state.draft_q_ids[slot, column],
            state.draft_q_probs[slot, column],
            row_keys(seed, position, round_, stream=ACCEPT_STREAM),
            # The residual reuses the row's own sampling noise: a row's own sample is used
            # only where it tests nothing and its residual only where it tests and rejects,
            # so each token still gets fresh noise - and the noise over the vocabulary, the
            # costliest draw, is generated once per row (the same key and shape: XLA
            # computes it once).
            row_keys(seed, position), fallback=own)
        return jnp.where(tests, outcome, own)


def rejection_outcome(p, x, q_ids, q_probs, accept_keys, residual_keys, *, fallback):
    """One speculative rejection test per row -> [R] int32: the draft x if accepted, else a
    draw from norm(max(0, p - q)), which is never x.

    p [R, V] the target's probabilities; x [R] drafts drawn from q, given in support form
    q_ids / q_probs [R, M] (ids -1 unused); accept_keys, residual_keys [R] PRNG keys;
    fallback [R]: the token where p == q leaves no residual (then x is always accepted, so it
    only stands in for rounding).
    """
    p_x = jnp.take_along_axis(p, x[:, None], axis=-1)[:, 0]
    q_x = jnp.sum(jnp.where(q_ids == x[:, None], q_probs, 0.0), axis=-1)
    u = jax.vmap(jax.random.uniform)(accept_keys)
    accept = u * q_x < p_x  # P = min(1, p(x) / q(x))
    vocab = p.shape[-1]
    rows = jnp.arange(p.shape[0])[:, None]
    q = jnp.zeros_like(p).at[rows, jnp.where(q_ids < 0, vocab, q_ids)].add(
        q_probs, mode="drop")  # [R, V] dense q
    residual = jnp.maximum(p - q, 0.0)
    redrawn = jax.vmap(jax.random.categorical)(residual_keys, jnp.log(residual))
    redrawn = jnp.where(residual.sum(axis=-1) > 0.0, redrawn, fallback)
    return jnp.where(accept, x, redrawn).astype(jnp.int32)


class SyntheticAcceptance(ExactMatch):
    """Acceptance drawn from a workload profile (planner/synthetic.py): a per-request quality
    fixed at admission and a drifting difficulty, as in the simulator; vectorised over slots."""

    _BLOCK = 32  # steps of draws made at once

    def __init__(self, profile: str, *, num_slots: int, max_depth: int, seed: int):
        from lightspec_jax.planner.synthetic import AcceptanceModel

        self.name = profile
        self.model = AcceptanceModel.calibrated(profile)
        self.max_depth = max_depth
        # Admissions and outcomes draw from one stream, the drift's innovations from another,
        # so the drift's path is the same whichever steps verify.
        self.rng, self._drift_rng = (np.random.default_rng(s)
                                     for s in np.random.SeedSequence(seed).spawn(2))
        self.quality = np.zeros(num_slots)
        self.drift = np.zeros(num_slots)
        # The drift moves every step: its innovations [_BLOCK, N], drawn a block of steps at
        # a time. The outcomes' draws (StepDraws [_BLOCK, N, K]) are made a block of verifying
        # steps at a time: a step that verifies no draft (the floor) reads no outcome, and
        # drawing them was most of this verifier's host time there (about 45 of 75 us a step
        # at c = 256), time a real verifier does not spend.
        self._innovations, self._drift_at = None, self._BLOCK
        self._draws, self._draws_at = None, self._BLOCK
        self._nothing = self.empty_inputs(num_slots, max_depth)  # a floor step's inputs

    def empty_inputs(self, num_slots: int, max_depth: int):
        return (np.zeros((num_slots,), np.int32), np.zeros((num_slots, max_depth), np.float32))

    def admit(self, slots: np.ndarray) -> None:
        if len(slots):
            self.quality[slots] = self.rng.normal(self.model.mu, self.model.profile.request_sigma,
                                                  len(slots))
            self.drift[slots] = self.model.initial_drift(self.rng, len(slots))

    def host_inputs(self, active: np.ndarray, verifies: bool = True):
        """(accepted-if-fully-verified [N] i32, fill confidences [N, K] f32) for this step;
        zeros for a step that verifies no draft (`verifies` False), which reads neither.

        Every slot responds (an idle slot's drift runs on; admission redraws it) to draws made
        `_BLOCK` steps at a time: this runs on the host every step, in the loop's time."""
        n, k, b = len(self.quality), self.max_depth, self._BLOCK
        rng = self.rng
        if self._drift_at == b:
            self._innovations = self.model.innovations(self._drift_rng.standard_normal((b, n)))
            self._drift_at = 0
        innovation = self._innovations[self._drift_at]  # [N]
        self._drift_at += 1
        if not verifies:
            self.drift = self.model.drifted(self.drift, innovation)
            return self._nothing
        if self._draws_at == b:  # drawn, and what does not depend on the state prepared
            self._draws = self.model.prepare(None, rng.standard_normal((b, n, k)),
                                             rng.random((b, n, k)), rng.standard_normal((b, n, k)))
            self._draws_at = 0
        draws = dataclasses.replace(self._draws[self._draws_at], drift=innovation)
        self._draws_at += 1
        self.drift, accepted, conf = self.model.respond_drawn(self.quality, self.drift, draws)
        accept = np.where(active, accepted, 0).astype(np.int32)
        return accept, np.where(active[:, None], conf, 0.0).astype(np.float32)

    def fill_confidence(self, state, extra):
        return extra[1]

    def verify(self, target_tokens, layout, draft_tokens, extra):
        """Accepts each slot's drawn prefix, cut to the drafts actually verified."""
        accept_full = extra[0]
        max_depth = draft_tokens.shape[1]
        accepted = jnp.where(layout.slot_valid, jnp.minimum(accept_full, layout.lengths), 0)
        offsets = jnp.arange(max_depth + 1)  # [K+1]
        rows = jnp.clip(layout.row_start[:, None] + offsets[None, :], 0,
                        target_tokens.shape[0] - 1)  # [N, K+1]
        keep = layout.slot_valid[:, None] & (offsets[None, :] <= accepted[:, None])
        out_tokens = jnp.where(keep, target_tokens[rows], -1)
        num_new = jnp.where(layout.slot_valid, accepted + 1, 0)
        return (accepted.astype(jnp.int32), out_tokens.astype(jnp.int32),
                num_new.astype(jnp.int32))


def verifier_for(config, *, speculative: bool, num_slots: int, max_depth: int):
    """The verifier an EngineConfig asks for: synthetic acceptance (benchmarks), rejection
    sampling (verification="probabilistic"), or exact match, with coupled drafts or not."""
    spec = config.speculative
    probabilistic = speculative and spec.verification == "probabilistic"
    if probabilistic and config.synthetic_acceptance:
        raise ValueError("synthetic_acceptance draws verification outcomes, so it cannot be "
                         "combined with verification='probabilistic'")
    if speculative and config.synthetic_acceptance:
        return SyntheticAcceptance(config.synthetic_acceptance, num_slots=num_slots,
                                   max_depth=max_depth, seed=config.seed)
    if probabilistic:
        return RejectionSampling(spec.proposal_support)
    return ExactMatch(spec.proposal_support if spec.coupled_drafts else 0)
