"""The DSpark block drafter in Flax NNX: a DFlash body plus a low-rank Markov head and a
confidence head (DSpark, arXiv 2607.05147; code deepseek-ai/DeepSpec).

Read from DeepSpec (`deepspec/modeling/dspark/qwen3/modeling.py`, `.../markov_head.py`,
`deepspec/eval/dspark/draft_ops.py`), in our own words:

* body: exactly DFlash's (reference/checkpoint-formats.md §3, models/dflash.py): the target's
  features at committed positions through fc and hidden_norm become context K/V; the block
  [bonus token at position seq_len, then P-1 mask tokens] runs once through non-causal Qwen3
  layers and a final norm. Unlike z-lab DFlash, EVERY block row drafts: row k (0..P-1) predicts
  the token at seq_len + k + 1 (DeepSpec's labels are anchor + 1 .. anchor + P), so one
  forward yields P drafts. The lm_head that reads the rows is a frozen copy of the target's
  (DeepSpec `initialize_embeddings_and_head`), so the target's own head serves here.
* Markov head (markov_head_type "vanilla", `VanillaMarkov` in markov_head.py): a rank-r
  bigram correction. Row k's logits = lm_head(h_k) + W2 W1[x_{k-1}], with W1 [V, r] an
  embedding of the previous token and W2 [r, V] a linear map; x_{-1} is the bonus token and
  x_{k-1} for k >= 1 the token drafted at row k-1 (argmax for greedy, else a draw), so the
  layers run once per block and only this head is sequential over rows. markov_rank = 0: no
  head (DeepSpec `build_markov_head` returns None), rows are independent.
* confidence head (`AcceptRatePredictor`, `Qwen3DSparkModel.predict_confidence_step`): one
  linear unit, c_k = sigmoid(w . f_k + b) with f_k = h_k, or [h_k ; W1[x_{k-1}]] when
  confidence_head_with_markov. It is trained (deepspec/modeling/dspark/loss.py) with BCE
  against 1 - TV(p_draft, p_target) of row k, i.e. c_k estimates P(row k is accepted | rows
  before it were), and DeepSpec ranks prefixes by the cumulative product, as our fill does.

Axis legend (as in dflash.py): N slots, P block rows, R rows, H hidden, r Markov rank,
V vocab.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from .config import ConfigError
from .dflash import DFlash, DFlashConfig

MARKOV_HEAD_TYPES = ("vanilla",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DSparkConfig(DFlashConfig):
    """DFlashConfig's fields (block_size P: rows of one forward, all of them drafts) plus the
    two heads. target_layer_ids may hold -1: the embedding output (DeepSpec
    `validate_target_layer_ids`), aux layer 0 in Qwen3's convention."""

    markov_rank: int = 0  # r; 0: no Markov head
    markov_head_type: str = "vanilla"
    confidence_head: bool = False  # config.json enable_confidence_head
    confidence_head_with_markov: bool = False  # the head also reads W1[x_{k-1}]

    NAME = "DSpark"
    MIN_LAYER_ID = -1

    def __post_init__(self):
        super().__post_init__()
        if list(self.target_layer_ids) != sorted(self.target_layer_ids):
            raise ConfigError(f"target_layer_ids must be strictly increasing (DSpark's fc reads "
                              f"them in that order), got {list(self.target_layer_ids)}")
        if not isinstance(self.markov_rank, int) or self.markov_rank < 0:
            raise ConfigError(f"markov_rank must be an int >= 0, got {self.markov_rank!r}")
        if self.markov_rank and self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ConfigError(f"markov_head_type={self.markov_head_type!r} is not supported; "
                              f"supported: {list(MARKOV_HEAD_TYPES)}")
        if self.confidence_head_with_markov and not (self.confidence_head and self.markov_rank):
            raise ConfigError("confidence_head_with_markov needs a confidence head "
                              "(enable_confidence_head) and a Markov head (markov_rank > 0), "
                              f"got enable_confidence_head={self.confidence_head}, "
                              f"markov_rank={self.markov_rank}")

    @property
    def confidence_features(self) -> int:
        """The confidence head's input width: H, plus r with the Markov embedding."""
        return self.hidden_size + (self.markov_rank if self.confidence_head_with_markov else 0)


class DSpark(DFlash):
    """DFlash's body (context K/V, block forward) with the DSpark heads as extra parameters."""

    def __init__(self, cfg: DSparkConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        super().__init__(cfg, dtype=dtype, rngs=rngs)
        v, r = cfg.vocab_size, cfg.markov_rank

        def normal(shape, scale):
            return nnx.Param((scale * jax.random.normal(rngs.params(), shape, jnp.float32))
                             .astype(dtype))

        self.markov_w1 = normal((v, r), 0.02) if r else None  # [V, r]: previous-token embedding
        self.markov_w2 = normal((r, v), 0.02) if r else None  # [r, V]
        on = cfg.confidence_head
        self.confidence_w = normal((cfg.confidence_features, 1), 0.02) if on else None  # [H(+r), 1]
        self.confidence_b = nnx.Param(jnp.zeros((1,), dtype)) if on else None  # [1]

    def markov_logits(self, prev_tokens: jax.Array) -> jax.Array:
        """The Markov term W2 W1[prev] [R, V] f32 for the previous tokens [R] (zero without a
        Markov head). DeepSpec `VanillaMarkov.compute_step_bias`."""
        if self.markov_w1 is None:
            return jnp.zeros((prev_tokens.shape[0], self.config.vocab_size), jnp.float32)
        latent = self.markov_w1[...][prev_tokens]  # [R, r]
        return jnp.einsum("rk,kv->rv", latent, self.markov_w2[...],
                          preferred_element_type=jnp.float32)

    def confidence(self, hidden: jax.Array, prev_tokens: jax.Array) -> jax.Array | None:
        """c = P(row accepted | its prefix accepted) [R] f32 for block rows hidden [R, H] whose
        previous tokens are prev_tokens [R]; None without a confidence head. DeepSpec
        `Qwen3DSparkModel.predict_confidence_step`, then the sigmoid of draft_ops.py."""
        if self.confidence_w is None:
            return None
        features = hidden.astype(jnp.float32)  # [R, H]
        if self.config.confidence_head_with_markov:
            latent = self.markov_w1[...][prev_tokens].astype(jnp.float32)  # [R, r]
            features = jnp.concatenate([features, latent], axis=-1)  # [R, H+r]
        logit = features @ self.confidence_w[...].astype(jnp.float32)  # [R, 1]
        return jax.nn.sigmoid(logit[:, 0] + self.confidence_b[...].astype(jnp.float32)[0])
