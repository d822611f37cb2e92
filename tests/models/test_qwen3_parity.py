"""Qwen3 forward vs transformers (eager, fp32), and cached row-by-row == one full forward."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from lightspec_jax.checkpoint import load_qwen3

ATOL = 1e-4


@pytest.fixture(scope="module")
def loaded(hf_checkpoint):
    directory, hf_model = hf_checkpoint
    return load_qwen3(directory), hf_model


def _full_forward(model, tokens, slot=0, num_slots=2, aux_layers=()):
    t = len(tokens)
    cache = model.new_cache(num_slots=num_slots, max_len=64)
    return model(jnp.asarray(tokens, jnp.int32), jnp.arange(t, dtype=jnp.int32),
                 jnp.full((t,), slot, jnp.int32), cache, aux_layers=aux_layers)


def test_logits_and_hidden_states_match_transformers(loaded):
    model, hf_model = loaded
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.config.vocab_size, size=23)
    with torch.no_grad():
        ref = hf_model(torch.tensor(tokens)[None], output_hidden_states=True)
    num_layers = model.config.num_layers
    aux = (0, 2, num_layers // 2, num_layers - 3, num_layers)  # L = HF's post-norm last entry
    out = _full_forward(model, tokens, slot=1, aux_layers=aux)
    np.testing.assert_allclose(np.asarray(out.logits), ref.logits[0].numpy(), atol=ATOL, rtol=0)
    h = model.config.hidden_size
    for a, j in enumerate(aux):
        np.testing.assert_allclose(np.asarray(out.aux_hidden[:, a * h:(a + 1) * h]),
                                   ref.hidden_states[j][0].numpy(), atol=ATOL, rtol=0,
                                   err_msg=f"hidden state entering layer {j}")


def test_cached_rows_equal_full_forward_across_slots(loaded):
    """Prefill in chunks, then one row at a time, several slots interleaved in each call."""
    model, _ = loaded
    rng = np.random.default_rng(1)
    lengths = {0: 19, 2: 11, 3: 16}
    seqs = {s: rng.integers(0, model.config.vocab_size, size=n) for s, n in lengths.items()}
    full = {s: np.asarray(_full_forward(model, seq).logits) for s, seq in seqs.items()}

    cache = model.new_cache(num_slots=4, max_len=64)
    got = {s: [] for s in seqs}
    done = {s: 0 for s in seqs}
    chunk_sizes = [7, 5, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    for chunk in chunk_sizes:
        rows = [(s, p) for s in seqs for p in range(done[s], min(done[s] + chunk, lengths[s]))]
        if not rows:
            break
        pad = 3  # padding rows (slot = N) must not disturb anything
        slots = np.array([s for s, _ in rows] + [4] * pad, np.int32)
        positions = np.array([p for _, p in rows] + [0] * pad, np.int32)
        tokens = np.array([seqs[s][p] for s, p in rows] + [0] * pad, np.int32)
        out = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(slots), cache)
        cache = out.cache
        for i, (s, p) in enumerate(rows):
            got[s].append(np.asarray(out.logits[i]))
            done[s] = p + 1
    for s in seqs:
        assert done[s] == lengths[s]
        np.testing.assert_allclose(np.stack(got[s]), full[s], atol=ATOL, rtol=0,
                                   err_msg=f"slot {s}")


def test_logits_rows_selects_rows(loaded):
    model, _ = loaded
    tokens = np.arange(9) % model.config.vocab_size
    cache = model.new_cache(num_slots=1, max_len=16)
    args = (jnp.asarray(tokens, jnp.int32), jnp.arange(9, dtype=jnp.int32), jnp.zeros(9, jnp.int32), cache)
    full = model(*args).logits
    picked = model(*args, logits_rows=jnp.array([8, 3], jnp.int32)).logits
    np.testing.assert_array_equal(np.asarray(picked), np.asarray(full)[[8, 3]])


def test_unrolled_layers_equal_the_layer_loop(loaded, monkeypatch):
    """LIGHTSPEC_UNROLL_LAYERS=1 (one straight-line step, read at trace time) computes what
    the layer loop computes: logits, collected hidden states and the cache it writes."""
    from lightspec_jax.models.layers import UNROLL_LAYERS_ENV, layer_unroll

    model, _ = loaded
    tokens = np.random.default_rng(2).integers(0, model.config.vocab_size, size=13)
    aux = (0, 1, model.config.num_layers)
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(UNROLL_LAYERS_ENV, flag)
        assert layer_unroll(5) == (5 if flag == "1" else 1)
        outs[flag] = _full_forward(model, tokens, slot=1, aux_layers=aux)
    loop, unrolled = outs["0"], outs["1"]
    for name, a, b in (("logits", loop.logits, unrolled.logits),
                       ("aux", loop.aux_hidden, unrolled.aux_hidden),
                       ("k", loop.cache.k, unrolled.cache.k), ("v", loop.cache.v, unrolled.cache.v)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=0, err_msg=name)
