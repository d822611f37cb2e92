"""How a decode step turns the target's tokens into accepted spans: an object the runner is
built with, so the core has no benchmark branch.

`ExactMatch` (the default) is lossless: a draft is accepted when it equals the target's own
token (argmax, or the seeded sample at its position). `SyntheticAcceptance` is for benchmarks
of untrained or random-weight models: it draws each slot's accepted length and the fill's
confidences from a workload profile, so every device cost is real while the emitted tokens are
not the target's; every result that used it says so.

Axis legend: N slots, K max draft depth, B verify rows.
"""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp

from lightspec_jax.pallas_kernels import verify


class ExactMatch:
    """Lossless exact-match verification (the production verifier)."""

    name = None  # nothing to label in results

    def empty_inputs(self, num_slots: int, max_depth: int):
        return ()

    def host_inputs(self, active: np.ndarray):
        """Per-step host inputs for the slots marked in `active` [N] bool: none."""
        return ()

    def admit(self, slots: np.ndarray) -> None:
        pass

    def fill_confidence(self, state, extra):
        return state.draft_conf  # [N, K]

    def verify(self, target_tokens, layout, draft_tokens, extra):
        """-> accepted [N], out_tokens [N, K+1], num_new [N] (pallas_kernels.verify)."""
        return verify(target_tokens, layout, draft_tokens)


class SyntheticAcceptance(ExactMatch):
    """Acceptance drawn from a workload profile (planner/synthetic.py): a per-request quality
    fixed at admission and a drifting difficulty, as in the simulator; vectorised over slots."""

    _BLOCK = 32  # steps of draws made at once

    def __init__(self, profile: str, *, num_slots: int, max_depth: int, seed: int):
        from lightspec_jax.planner.synthetic import AcceptanceModel

        self.name = profile
        self.model = AcceptanceModel.calibrated(profile)
        self.max_depth = max_depth
        self.rng = np.random.default_rng(seed)
        self.quality = np.zeros(num_slots)
        self.drift = np.zeros(num_slots)
        self._draws: tuple[np.ndarray, ...] = (np.zeros((0,)),)  # a block of steps' draws
        self._at = 0  # the next step's index in the block

    def empty_inputs(self, num_slots: int, max_depth: int):
        return (np.zeros((num_slots,), np.int32), np.zeros((num_slots, max_depth), np.float32))

    def admit(self, slots: np.ndarray) -> None:
        if len(slots):
            self.quality[slots] = self.rng.normal(self.model.mu, self.model.profile.request_sigma,
                                                  len(slots))
            self.drift[slots] = self.model.initial_drift(self.rng, len(slots))

    def host_inputs(self, active: np.ndarray):
        """(accepted-if-fully-verified [N] i32, fill confidences [N, K] f32) for this step.

        Every slot responds (an idle slot's drift runs on; admission redraws it) to draws made
        `_BLOCK` steps at a time: this runs on the host every step, in the loop's time."""
        if self._at == len(self._draws[0]):
            n, k, b = len(self.quality), self.max_depth, self._BLOCK
            rng = self.rng
            self._draws = (rng.standard_normal((b, n)), rng.standard_normal((b, n, k)),
                           rng.random((b, n, k)), rng.standard_normal((b, n, k)))
            self._at = 0
        at, self._at = self._at, self._at + 1
        self.drift, accepted, conf = self.model.respond(
            self.quality, self.drift, *(d[at] for d in self._draws))
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
