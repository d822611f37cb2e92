"""DSpark as a drafter: DFlash's context and block forward, then a Markov chain over the rows.

The cache, prefill and commit are DFlash's (drafters/dflash.py: the context K/V of committed
positions, written at every verify). Drafting runs the block [bonus, mask x (P-1)] once; row k
(0..d-1) drafts position seq_len + k + 1 (DeepSpec `deepspec/eval/dspark/draft_ops.py`
build_dspark_proposal reads block rows from 0), so one block yields up to P drafts. The rows'
logits come from the layers at once; only the Markov term W2 W1[x_{k-1}] is sequential: row k's
distribution is lm_head(h_k) + W2 W1[x_{k-1}], x_{-1} the bonus token, x_{k-1} the token row
k-1 drafted (its argmax, or its draw for a sampled request: position by position, as DeepSpec's
`VanillaMarkov.sample_block_tokens`), a loop of d cheap [N, r] x [r, V] steps.

Confidence: with a confidence head, c_k = sigmoid(head(h_k[, W1[x_{k-1}]])), DeepSpec's
estimate of P(row k accepted | rows before it accepted), which is what the fill multiplies
into prefix survivals (pallas_kernels/fill.py; reference/lightspec-algorithm.md §7, "for
DSpark, c_j is the sigmoid of the confidence head"). It is known before row k's draw (it reads
x_{k-1}, not x_k), as the Draw contract asks. Without the head: the drafter's top-1
probability (max q for a sampled request), as DFlash.

Axis legend: N slots, P block rows, d depth, K max depth, H hidden, V vocab.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..sampling import draw_proposal
from .base import chain, support
from .dflash import DFlashDrafter


class DSparkDrafter(DFlashDrafter):
    """DSparkDrafter(model: DSpark, target: Qwen3): the target's lm_head reads the block
    (DSpark's own is a frozen copy of it)."""

    kind = "parallel"
    method = "dspark"
    first_row = 0  # every block row drafts
    # Always the whole block: DeepSpec's confidence head is calibrated on whole blocks.
    block_lead = None

    def read_out(self, wrapped, rows, *, last_token, seq_len, max_depth, target_embed,
                 sampling):
        model = wrapped.model
        n, depth, h = rows.shape  # rows [N, d, H]
        base = self.logits(wrapped, rows, target_embed)  # [N, d, V]

        def step(carry, prev, k):  # prev [N]: the token before row k
            logits = base[:, k] + model.markov_logits(prev)  # [N, V]
            return carry, draw_proposal(logits, seq_len + k + 1, sampling)

        _, proposal = chain(step, None, last_token, depth=depth, max_depth=max_depth,
                            support=support(sampling))
        # The confidence head reads (h_k, x_{k-1}): vectorised once the chain is drawn.
        prev = jnp.concatenate([last_token[:, None], proposal.tokens[:, :depth - 1]], axis=1)
        conf = model.confidence(rows.reshape(n * depth, h), prev.reshape(-1))  # [N*d] or None
        if conf is None:
            return proposal
        conf = jnp.pad(conf.reshape(n, depth), ((0, 0), (0, max_depth - depth)))  # [N, K]
        return proposal._replace(confidence=conf)
