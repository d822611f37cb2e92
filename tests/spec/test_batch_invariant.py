"""EngineConfig(batch_invariant=True): greedy bfloat16 output is bitwise the same whatever the
batch - a request served alone, inside a batch of others (staggered arrivals, chunked
prefill), or verified speculatively at any width by any policy.

The power check comes first: on the same bfloat16 model the default mode's logits for a row
do change with the rows around it, so the invariant below is not a property the model has
anyway (served by the default mode, the greedy cases below differed from the request alone
in 3 of 93 requests when this was written).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from lightspec_jax.drafters import DraftLMDrafter
from lightspec_jax.models import Qwen3, Qwen3Config
from lightspec_jax.config import BATCH_INVARIANT_ROW_TILE

from test_lossless import serve

# Wide enough (hidden 256, intermediate 768) that a matmul's summation order follows its row
# count on the CPU; random weights, so the argmax has near ties for bfloat16 to flip.
CFG = Qwen3Config(vocab_size=384, hidden_size=256, intermediate_size=768, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=64)
BASE = dict(dtype="bfloat16", max_model_len=96, max_num_batched_tokens=16,
            compilation_cache_dir=None, show_progress=False, batch_invariant=True,
            compile_on_first_use=True)
# name -> (slots, policy, K, verify buckets). The dynamic engine has the static one's shapes,
# so their verify, prefill and depth-3 draft steps are the same programs (compiled once, the
# second from the persistent cache); it verifies any width the planner picks up to 16.
ENGINES = {"alone": (1, "none", 0, None), "plain": (4, "none", 0, None),
           "static_k3": (4, "static", 3, (4, 8, 16)),
           "dynamic_k3": (4, "dynamic", 3, (4, 8, 16))}


def target():
    return Qwen3(CFG, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def engines():
    built = {}

    def get(name):
        if name not in built:
            slots, policy, k, buckets = ENGINES[name]
            config = EngineConfig(max_num_seqs=slots, verify_buckets=buckets,
                                  speculative=SpeculativeConfig(policy=policy,
                                                                num_speculative_tokens=k),
                                  **BASE)
            # The target's own copy, a fifth of its tokens corrupted: long accepted spans and
            # rejections, so verify widths vary from step to step.
            drafter = DraftLMDrafter(target(), corrupt_rate=0.2, seed=7) if k else None
            built[name] = Engine(target(), config=config, drafter=drafter)
        return built[name]
    return get


def _forward(model, tile):
    """One jitted forward per test (a new function per call would trace and compile again for
    every call, same shapes or not): rows -> (logits, cache)."""
    def fn(tokens, positions, slots, cache):
        out = model(tokens, positions, slots, cache, row_tile=tile)
        return out.logits, out.cache
    jitted = jax.jit(fn)
    return lambda *rows, cache: jitted(*(jnp.asarray(x) for x in rows), cache)


@pytest.mark.parametrize("tile", [None, BATCH_INVARIANT_ROW_TILE])
def test_a_rows_logits_follow_the_batch_only_without_tiles(tile):
    """One decode row per slot, scored alone, in a batch, and as the first of 3 verify rows
    against a longer cache strip: bitwise equal with tiles, not without (the power check)."""
    model = target()
    forward = _forward(model, tile)
    logits = lambda *rows, cache: np.asarray(forward(*rows, cache=cache)[0])  # noqa: E731
    rng = np.random.default_rng(0)
    n = 6
    lens = rng.integers(5, 60, n)
    tokens = rng.integers(0, CFG.vocab_size, (n, 64))
    scores = []
    for strip in (96, 160):
        cache = model.new_cache(num_slots=n, max_len=strip)
        rows = np.concatenate([np.arange(length) for length in lens])
        slots = np.concatenate([np.full(length, i) for i, length in enumerate(lens)])
        _, cache = forward(tokens[slots, rows], rows, slots, cache=cache)
        nxt = tokens[np.arange(n), lens]
        alone = np.stack([logits(nxt[i:i + 1], lens[i:i + 1], [i], cache=cache)[0]
                          for i in range(n)])
        batched = logits(nxt, lens, np.arange(n), cache=cache)
        verify = logits(np.stack([nxt, tokens[:, 0], tokens[:, 1]], 1).ravel(),
                        (lens[:, None] + np.arange(3)).ravel(), np.repeat(np.arange(n), 3),
                        cache=cache)[::3]
        scores += [alone, batched, verify]
    equal = [np.array_equal(scores[0], s) for s in scores[1:]]
    if tile is None:
        assert not all(equal), "the default mode should not be batch invariant on this model"
    else:
        assert all(equal)


def test_batch_invariant_refuses_a_mesh():
    with pytest.raises(ValueError, match="one device"):
        EngineConfig(batch_invariant=True, tensor_parallel_size=2)


def random_requests(rng, slots, temperature=0.0):
    requests = []
    for i in range(int(rng.integers(2, slots * 2 + 1))):
        prompt = rng.integers(2, CFG.vocab_size, size=int(rng.integers(1, 40))).tolist()
        params = SamplingParams(max_tokens=int(rng.integers(4, 28)), ignore_eos=True,
                                temperature=temperature, seed=i)
        requests.append((f"r{i}", prompt, params, int(rng.integers(0, 10))))  # arrival step
    return requests


def test_greedy_bf16_output_is_the_same_in_any_batch(engines):
    rng = np.random.default_rng(16)
    alone = engines("alone")
    for case in range(6):
        requests = random_requests(rng, 4)
        want = {rid: alone.generate([prompt], params)[0].token_ids
                for rid, prompt, params, _ in requests}
        for name in ("plain", "static_k3", "dynamic_k3"):
            outputs = serve(engines(name), requests)
            for rid, *_ in requests:
                assert outputs[rid].token_ids == want[rid], f"{name} case {case} request {rid}"


def test_seeded_sampled_bf16_output_is_the_same_in_any_batch(engines):
    """Exact-match verification of seeded samples: the target's seeded draw at each row,
    from bitwise-equal logits, so the same tokens alone, batched and speculative."""
    rng = np.random.default_rng(7)
    alone = engines("alone")
    for case in range(2):
        requests = random_requests(rng, 4, temperature=0.8)
        want = {rid: alone.generate([prompt], params)[0].token_ids
                for rid, prompt, params, _ in requests}
        for name in ("plain", "static_k3"):
            outputs = serve(engines(name), requests)
            for rid, *_ in requests:
                assert outputs[rid].token_ids == want[rid], f"{name} case {case} request {rid}"


def test_speculation_really_runs_batched(engines):
    """The engines above verify several rows per request and several requests per step."""
    engine = engines("static_k3")
    engine.stats.steps.clear()
    engine.generate([[5, 9, 17], [200, 3, 4, 5], [42] * 12, [7] * 3],
                    SamplingParams(max_tokens=16, ignore_eos=True))
    steps = engine.stats.steps
    assert max(s.num_requests for s in steps) >= 3
    assert max(s.used_rows for s in steps) > 2 * max(s.num_requests for s in steps)
