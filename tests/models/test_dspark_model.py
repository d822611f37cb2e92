"""DSpark drafter vs an independent float64 NumPy reference written from DeepSpec's rules
(`deepspec/modeling/dspark/markov_head.py` VanillaMarkov, `.../qwen3/modeling.py`
predict_confidence_step, `deepspec/eval/dspark/draft_ops.py` build_dspark_proposal), fed with
transformers' own hidden states of the tiny target.

The block forward is DFlash's reference (test_dflash_model.ReferenceDFlash, reading the DeepSpec
files' top-level ids and mask id, id -1 = HF hidden_states[0]); on top of it: every block row
drafts, row k's logits = lm_head(h_k) + W2 W1[x_{k-1}] with x_{-1} the bonus token and x_{k-1}
the token row k-1 drafted, and c_k = sigmoid(w . [h_k ; W1[x_{k-1}]] + b).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dspark_fixtures import write_deepspec_dspark
from lightspec_jax.checkpoint import load_dspark, load_qwen3
from lightspec_jax.drafters import DraftRows, DSparkDrafter
from lightspec_jax.models import PRESETS, DSpark, DSparkConfig
from lightspec_jax.sampling import ProposalSampling
from test_dflash_model import ReferenceDFlash, _features, _hf_states

IDS = (-1, 4, 7)  # -1: the embedding output (hidden_states[0]); 7 = L-1: hidden_states[8]
BLOCK = 4
RANK = 8
# (markov_rank, confidence head, with Markov features)
HEADS = {"markov+confidence": (RANK, True, True), "markov": (RANK, False, False),
         "confidence_only": (0, True, False)}


class ReferenceDSpark(ReferenceDFlash):
    def markov(self, prev):  # [V] f64: W2 W1[prev]
        if not self.hf["markov_rank"]:
            return 0.0
        return self.w["markov_head.markov_w2.weight"] @ self.w["markov_head.markov_w1.weight"][prev]

    def confidence(self, h, prev):
        if not self.hf["enable_confidence_head"]:
            return None
        f = h
        if self.hf["confidence_head_with_markov"]:
            f = np.concatenate([h, self.w["markov_head.markov_w1.weight"][prev]])
        z = f @ self.w["confidence_head.proj.weight"][0] + self.w["confidence_head.proj.bias"][0]
        return 1.0 / (1.0 + np.exp(-z))

    def greedy(self, features, bonus, depth):
        """(tokens, top-1 probabilities, head confidences or None) of rows 0..depth-1."""
        hidden, _ = self.block(features, bonus)
        tokens, probs, conf, prev = [], [], [], bonus
        for k in range(depth):
            logits = hidden[k] @ self.lm_head.T + self.markov(prev)  # [V]
            p = np.exp(logits - logits.max())
            p /= p.sum()
            c = self.confidence(hidden[k], prev)
            prev = int(logits.argmax())
            tokens.append(prev)
            probs.append(p[prev])
            conf.append(c)
        return tokens, np.asarray(probs), None if conf[0] is None else np.asarray(conf)

    def logits_given(self, features, bonus, drafted):
        """Rows' logits [d, V] when rows 0..d-1 follow `drafted` (a sampled chain)."""
        hidden, _ = self.block(features, bonus)
        prev = [bonus] + list(drafted[:-1])
        return np.stack([hidden[k] @ self.lm_head.T + self.markov(prev[k])
                         for k in range(len(drafted))])


@pytest.fixture(scope="module", params=sorted(HEADS))
def setup(request, hf_checkpoints, tmp_path_factory):
    target_dir, hf_model = hf_checkpoints["untied_sharded"]
    target = load_qwen3(target_dir)
    cfg = target.config
    rank, confidence, with_markov = HEADS[request.param]
    directory = str(tmp_path_factory.mktemp("dspark"))
    write_deepspec_dspark(directory, target_layers=cfg.num_layers, vocab_size=cfg.vocab_size,
                          target_layer_ids=IDS, block_size=BLOCK, mask_token_id=17,
                          markov_rank=rank, confidence=confidence, with_markov=with_markov,
                          seed=3)
    drafter = DSparkDrafter(load_dspark(directory, target_config=cfg), target)
    embed = hf_model.model.embed_tokens.weight.detach().double().numpy()
    head = hf_model.lm_head.weight.detach().double().numpy()
    return target, hf_model, drafter, ReferenceDSpark(directory, embed, head)


def _context(target, hf_model, drafter, ref, seqs, ctx_len):
    """A drafter cache holding each sequence's committed context (slot i = seqs[i]), written
    by a prefill and a commit whose rejected rows land past the block; the HF features."""
    rng = np.random.default_rng(1)
    feats = [_features(target, drafter, s) for s in seqs]
    states = [_hf_states(hf_model, s) for s in seqs]
    for f, st, c in zip(feats, states, ctx_len):  # our aux layers = HF hidden_states[id + 1]
        np.testing.assert_allclose(np.asarray(f)[:c], ref.features(st, c), atol=2e-5, rtol=1e-5)
    cache = drafter.new_cache(num_slots=2, cache_len=32)
    cache = cache._replace(k=jnp.full_like(cache.k, jnp.nan), v=jnp.full_like(cache.v, jnp.nan))
    prefill = DraftRows(token=None, next_token=None,
                        hidden=jnp.concatenate([feats[0][:ctx_len[0]], feats[1][:3]]),
                        position=jnp.asarray(list(range(ctx_len[0])) + [0, 1, 2], jnp.int32),
                        slot=jnp.asarray([0] * ctx_len[0] + [1] * 3, jnp.int32))
    cache = drafter.prefill(drafter.param_leaves, cache, prefill, target_embed=None)
    stale = jnp.asarray(rng.standard_normal((6, feats[1].shape[1])), jnp.float32)
    commit = DraftRows(token=None, next_token=None,
                       hidden=jnp.concatenate([feats[1][3:ctx_len[1]], stale]),
                       position=jnp.asarray(list(range(3, ctx_len[1] + 6)), jnp.int32),
                       slot=jnp.asarray([1] * (ctx_len[1] - 3 + 6), jnp.int32))
    cache = drafter.commit(drafter.param_leaves, cache, commit, tail_row=jnp.asarray([0, 2]),
                           target_embed=None)
    return cache, [ref.features(st, c) for st, c in zip(states, ctx_len)]


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(2, 250, 10).tolist(), rng.integers(2, 250, 7).tolist()]
    return seqs, [9, 6]  # committed positions; the last token of each is the bonus


@pytest.mark.parametrize("depth", [BLOCK, 2])
def test_greedy_block_matches_the_reference(setup, case, depth):
    target, hf_model, drafter, ref = setup
    seqs, ctx_len = case
    cache, features = _context(target, hf_model, drafter, ref, seqs, ctx_len)
    bonus = jnp.asarray([s[c] for s, c in zip(seqs, ctx_len)], jnp.int32)
    max_depth = BLOCK + 1
    _, proposal = drafter.draft(drafter.param_leaves, cache, last_token=bonus,
                                seq_len=jnp.asarray(ctx_len, jnp.int32),
                                drafting=jnp.asarray([True, True]), depth=depth,
                                max_depth=max_depth, target_embed=target.embed[...])
    assert proposal.tokens.shape == proposal.confidence.shape == (2, max_depth)
    for i in range(2):
        tokens, top, conf = ref.greedy(features[i], int(bonus[i]), depth)
        assert np.asarray(proposal.tokens[i]).tolist() == tokens + [0] * (max_depth - depth)
        want = top if conf is None else conf  # the head's c_k when there is one
        np.testing.assert_allclose(np.asarray(proposal.confidence[i, :depth]), want, atol=1e-5)
        assert not np.asarray(proposal.confidence[i, depth:]).any()


def test_sampled_rows_follow_the_drawn_chain(setup, case):
    """At temperature > 0 each row is drawn from its Markov-corrected q given the token drawn
    at the row before (position by position): q_ids / q_probs are the top-M softmax of that
    row's reference logits, and the drawn token is in its support."""
    target, hf_model, drafter, ref = setup
    seqs, ctx_len = case
    cache, features = _context(target, hf_model, drafter, ref, seqs, ctx_len)
    bonus = jnp.asarray([s[c] for s, c in zip(seqs, ctx_len)], jnp.int32)
    m = 16
    sampling = ProposalSampling(temperature=jnp.asarray([1.0, 0.0]),
                                top_k=jnp.zeros(2, jnp.int32), top_p=jnp.ones(2),
                                seed=jnp.asarray([5, 6], jnp.uint32),
                                round=jnp.asarray(ctx_len, jnp.int32), support=m,
                                vocab=target.config.vocab_size)
    _, proposal = drafter.draft(drafter.param_leaves, cache, last_token=bonus,
                                seq_len=jnp.asarray(ctx_len, jnp.int32),
                                drafting=jnp.asarray([True, True]), depth=BLOCK,
                                max_depth=BLOCK, target_embed=target.embed[...],
                                sampling=sampling)
    drawn = np.asarray(proposal.tokens[0]).tolist()
    logits = ref.logits_given(features[0], int(bonus[0]), drawn)  # [d, V]
    for k in range(BLOCK):
        top = np.argsort(-logits[k])[:m]
        q = np.exp(logits[k][top] - logits[k][top].max())
        q /= q.sum()
        assert np.asarray(proposal.q_ids[0, k]).tolist() == top.tolist()
        np.testing.assert_allclose(np.asarray(proposal.q_probs[0, k]), q, atol=1e-5)
        assert drawn[k] in top.tolist()
    greedy, _, _ = ref.greedy(features[1], int(bonus[1]), BLOCK)  # the greedy slot: argmax
    assert np.asarray(proposal.tokens[1]).tolist() == greedy


def test_depth_is_bounded_by_the_block(setup):
    target, _, drafter, _ = setup
    cache = drafter.new_cache(num_slots=1, cache_len=16)
    with pytest.raises(ValueError, match=r"depth must be in \[1, 4\].*block size 4 drafts at "
                                         r"most 4"):
        drafter.draft(drafter.param_leaves, cache, last_token=jnp.zeros(1, jnp.int32),
                      seq_len=jnp.ones(1, jnp.int32), drafting=jnp.ones(1, bool), depth=5,
                      max_depth=6, target_embed=target.embed[...])
    with pytest.raises(ValueError, match=r"num_speculative_tokens=5 exceeds .* at most "
                                         r"block_size = 4"):
        drafter.check_max_depth(5)


def test_real_size_shapes():
    """dspark_qwen3_8b_block7's shapes (reference/checkpoint-formats.md §6), eval_shape only."""
    cfg = DSparkConfig.for_target(PRESETS["qwen3-8b"], num_layers=5, block_size=7,
                                  mask_token_id=151669, target_layer_ids=(1, 9, 17, 25, 33),
                                  markov_rank=256, confidence_head=True,
                                  confidence_head_with_markov=True)
    model = nnx.eval_shape(lambda: DSpark(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    assert model.markov_w1.shape == (151936, 256) and model.markov_w2.shape == (256, 151936)
    assert model.confidence_w.shape == (4096 + 256, 1) and model.confidence_b.shape == (1,)
    graphdef, state = nnx.split(model)
    n = 4
    out = jax.eval_shape(
        lambda st, h, prev: (nnx.merge(graphdef, st).markov_logits(prev),
                             nnx.merge(graphdef, st).confidence(h, prev)),
        state, jax.ShapeDtypeStruct((n, 4096), jnp.bfloat16),
        jax.ShapeDtypeStruct((n,), jnp.int32))
    assert out[0].shape == (n, 151936) and out[1].shape == (n,)
