"""The DFlash block drafter inside the engine, loaded by Engine.from_pretrained from z-lab-layout
files: lossless under static and dynamic policies (chunked prefill, staggered arrivals, stops),
proposals equal to an offline block forward from the committed sequence alone (the commit's
context alignment; stale rows never leak), drafts that really get accepted, and K bounded by
the block."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from dflash_fixtures import write_zlab_dflash
from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from lightspec_jax.checkpoint import load_qwen3
from lightspec_jax.drafters import DFlashDrafter
from lightspec_jax.models.layers import rms_norm
from test_lossless import check_random_scenarios, random_scenario, serve
from test_lossless_aborts import check_churn

from conftest import BASE, fixed_costs

BLOCK = 5  # drafts up to 4 tokens per forward
K = 3
BUCKETS = (4, 8, 16)
CYCLING = [5, 9, 17, 33]  # the tiny target's greedy output soon cycles (225, 17, 18, ...)
ROWS = 64  # offline passes are padded to this many rows


def _config(policy, **kw):
    return EngineConfig(max_num_seqs=4, verify_buckets=BUCKETS,
                        speculative=SpeculativeConfig(policy=policy, num_speculative_tokens=K,
                                                      method="dflash"),
                        refresh_costs=False, **{**BASE, **kw})


@pytest.fixture(scope="module")
def random_dir(target_dir, tmp_path_factory):
    """A random DFlash on the default feature layers: its drafts depend on the context."""
    cfg = load_qwen3(target_dir).config
    path = str(tmp_path_factory.mktemp("dflash_random"))
    write_zlab_dflash(path, target_layers=cfg.num_layers, vocab_size=cfg.vocab_size,
                      block_size=BLOCK, mask_token_id=3, seed=5)
    return path


@pytest.fixture(scope="module")
def constant(plain_engine):
    """The token the target emits most after CYCLING."""
    out, = plain_engine.generate([CYCLING], SamplingParams(max_tokens=40, ignore_eos=True))
    return max(set(out.token_ids), key=out.token_ids.count)


@pytest.fixture(scope="module")
def constant_dir(target_dir, constant, tmp_path_factory):
    """A DFlash whose layers add nothing (o_proj = down_proj = 0), so every mask row leaves
    the stack as norm(embed[mask]); its norm weight points that at the target's lm_head column
    of `constant`: it always proposes `constant`, which the target often emits."""
    target = load_qwen3(target_dir)
    cfg, mask = target.config, 3
    path = tmp_path_factory.mktemp("dflash_constant")
    write_zlab_dflash(str(path), target_layers=cfg.num_layers, vocab_size=cfg.vocab_size,
                      block_size=BLOCK, mask_token_id=mask, seed=6)
    tensors = load_file(str(path / "model.safetensors"))
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = np.zeros_like(tensors[name])
    normed = np.asarray(rms_norm(target.embed[...][mask], jnp.ones(cfg.hidden_size), 1e-6))
    row = np.asarray(target.lm_head[...])[:, constant]  # [H]
    # Scaled so the softmax is sharp: a confident drafter, as a trained one often is.
    tensors["norm.weight"] = (30.0 / (row @ row) * row / normed).astype(np.float32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)


@pytest.fixture(scope="module")
def static_engine(target_dir, random_dir):
    # Read back before each dispatch, so the device proposal matches the host's sequence.
    return Engine.from_pretrained(target_dir, random_dir, config=_config("static",
                                                                         overlap=False))


@pytest.fixture(scope="module")
def constant_engine(target_dir, constant_dir):
    # The same executables as static_engine (weights are arguments): compile-cache hits.
    return Engine.from_pretrained(target_dir, constant_dir, config=_config("static"))


@pytest.fixture(scope="module")
def dynamic_engine(target_dir, constant_dir, tmp_path_factory):
    """Fixed costs: the block costs little, so drafting pays only while drafts are
    accepted."""
    path = fixed_costs(tmp_path_factory.mktemp("costs"), BUCKETS)
    return Engine.from_pretrained(target_dir, constant_dir,
                                  config=_config("dynamic", cost_table_path=path))


@pytest.mark.parametrize("name, cases", [("static_engine", 5), ("dynamic_engine", 5)])
def test_greedy_dflash_equals_target_only(name, cases, request, plain_engine):
    engine = request.getfixturevalue(name)
    assert isinstance(engine.drafter, DFlashDrafter)
    check_random_scenarios(engine, plain_engine, cases, name)


@pytest.mark.parametrize("name", ["static_engine", "dynamic_engine"])
def test_cut_blocks_stay_lossless_under_churn(name, request, plain_engine):
    """Blocks cut to the depth (static: K + 1 of the trained 5 rows; dynamic: whichever length
    it plans) under aborts mid-flight, staggered arrivals, chunked prefill (prompts past the
    32-row bucket) and greedy and seeded sampled requests mixed: target-only output."""
    engine = request.getfixturevalue(name)
    check_churn(engine, plain_engine, np.random.default_rng(len(name)), cases=4, sampled=True,
                label=name)


def test_drafts_are_accepted(constant_engine, constant, plain_engine):
    """After CYCLING the target cycles (225, 17, 18, ...): each step whose bonus token comes
    before `constant` (17) in the cycle accepts its first draft."""
    prompts = [CYCLING, [7, 8, 9]]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    outs = constant_engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain_engine.generate(prompts,
                                                                                      params)]
    proposals = np.asarray(constant_engine.runner.state.draft_tokens)[:2]
    assert proposals.tolist() == [[constant] * K] * 2
    assert outs[0].metrics.accepted >= 5


def test_dynamic_plans_block_lengths_and_the_floor(dynamic_engine, plain_engine):
    """DFlash truncates its block to the depth, so a dynamic engine defines a draft step for
    every depth 1..K (block lengths 2..K+1) and plans the floor too; mostly rejected drafts:
    it tries drafting, then the floor. (The suite's engines compile on first use: which
    depths are compiled yet depends on the tests that ran before.)"""
    spec = dynamic_engine.planner.spec
    assert (spec.floor, spec.block_size, spec.draft_depths) == (True, BLOCK,
                                                               tuple(range(1, K + 1)))
    assert set(dynamic_engine.runner.draft_registry.defined) == set(range(1, K + 1))
    rng = np.random.default_rng(3)
    for _ in range(3):
        serve(dynamic_engine, random_scenario(rng, dynamic_engine, plain_engine))
    depths = {s.draft_depth for s in dynamic_engine.stats.steps if s.verify_rows}
    assert 0 in depths and depths - {0} and depths <= set(range(K + 1))


@functools.partial(jax.jit, static_argnames=("graphs", "depth"))
def _offline(states, seq, n, *, graphs, depth):
    """The block drafted from a committed sequence alone: target features of positions
    0..n-1 from one forward, their context in a fresh cache, the block [seq[n], mask x depth]
    at position n (truncated to the depth, as the engine drafts)."""
    target, wrapped = (nnx.merge(g, s) for g, s in zip(graphs, states))
    model = wrapped.model
    rows = jnp.arange(ROWS, dtype=jnp.int32)
    slots = jnp.where(rows < n, 0, 1)  # past n: slot 1, dropped
    feats = target(seq[:ROWS], rows, slots, target.new_cache(num_slots=1, max_len=ROWS + 16),
                   aux_layers=model.config.aux_layers).aux_hidden
    cache = model.write_context(feats, rows, slots,
                                model.new_cache(num_slots=1, max_len=ROWS + 16))
    tokens = jnp.full((1, depth + 1), model.config.mask_token_id, jnp.int32).at[0, 0].set(seq[n])
    out = model(tokens, n[None], jnp.zeros(1, jnp.int32), cache, embed=target.embed[...])
    logits = out.hidden[0, 1:depth + 1] @ target.lm_head[...]
    return jnp.argmax(logits, axis=-1)


def test_engine_proposals_match_an_offline_block(static_engine):
    engine = static_engine
    drafter = engine.drafter
    (tg, ts), (dg, ds) = nnx.split(engine.model), nnx.split(drafter.module(drafter.param_leaves))
    rng = np.random.default_rng(12)
    for i in range(4):
        engine.add_request(f"p{i}", rng.integers(2, 250, size=int(rng.integers(3, 30))).tolist(),
                           SamplingParams(max_tokens=14, ignore_eos=True))
    checked = 0
    while engine.has_unfinished_requests():
        engine.step()
        device = np.asarray(engine.runner.state.draft_tokens)
        proposal_len = np.asarray(engine.runner.state.proposal_len)
        for request in engine._requests.values():
            if request.finished or proposal_len[request.slot] == 0:
                continue
            seq = request.prompt_token_ids + request.output_token_ids
            padded = np.zeros(ROWS + 1, np.int32)
            padded[:len(seq)] = seq
            want = _offline((ts, ds), jnp.asarray(padded), jnp.int32(len(seq) - 1),
                            graphs=(tg, dg), depth=K)
            assert device[request.slot, :K].tolist() == np.asarray(want).tolist()
            checked += 1
    assert checked >= 12


def test_k_beyond_the_block_is_refused(target_dir, random_dir):
    config = EngineConfig(max_num_seqs=2, speculative=SpeculativeConfig(
        policy="static", num_speculative_tokens=BLOCK, method="dflash"), **BASE)
    with pytest.raises(ValueError, match=r"num_speculative_tokens=5 exceeds .* block_size - 1 "
                                         r"= 4"):
        Engine.from_pretrained(target_dir, random_dir, config=config)
