"""The DSpark block drafter inside the engine, loaded by Engine.from_pretrained from DeepSpec-layout
files: lossless under static and dynamic policies (chunked prefill, staggered arrivals, stops,
aborts, seeded sampling with coupled drafts, overlap on and off), a Markov chain that really
drafts along the previous row's token and gets accepted, the confidence head's c_k as the
proposal's confidence, and K bounded by the block (every row drafts: K <= block_size).

The drafter: a random DSpark body whose Markov head (rank V, W1 = 4 I) is a bigram table of the
target's own greedy continuations (W2[next(a), a] = 10: +40 on next(a) after a), so the chain
of rows follows the target's cycles; its confidence head reads only the Markov features
(hidden weights 0), so c_k = sigmoid(4 u[x_{k-1}]) is a table the test can check.
"""

import gc

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dspark_fixtures import write_deepspec_dspark
from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from lightspec_jax.checkpoint import load_qwen3
from lightspec_jax.drafters import DSparkDrafter
from test_lossless import check_random_scenarios
from test_lossless_aborts import check_churn, overlap

from conftest import BASE, fixed_costs

BLOCK = 4  # every row drafts: K = 4
K = BLOCK
BUCKETS = (4, 8, 12, 20)
CYCLING = [5, 9, 17, 33]


def _config(policy, **kw):
    spec = dict(policy=policy, num_speculative_tokens=K, coupled_drafts=True)
    spec.update(kw.pop("spec", {}))
    return EngineConfig(**{**BASE, "max_num_seqs": 4, "verify_buckets": BUCKETS,
                           "refresh_costs": False, **kw},
                        speculative=SpeculativeConfig(**spec))


@pytest.fixture(scope="module")
def bigram(plain_engine):
    """next[a]: the token the target's greedy output most often puts after a."""
    rng = np.random.default_rng(0)
    prompts = [CYCLING] + [rng.integers(2, 250, 6).tolist() for _ in range(7)]
    outs = plain_engine.generate(prompts, SamplingParams(max_tokens=30, ignore_eos=True))
    v = plain_engine.vocab_size
    counts = np.zeros((v, v))
    for p, o in zip(prompts, outs):
        seq = p + o.token_ids
        np.add.at(counts, (seq[:-1], seq[1:]), 1)
    return np.where(counts.any(1), counts.argmax(1), rng.integers(2, v, v))


@pytest.fixture(scope="module")
def conf_table(target_dir):
    u = np.random.default_rng(1).uniform(-1, 1, load_qwen3(target_dir).config.vocab_size)
    return 1 / (1 + np.exp(-4 * u)), u


@pytest.fixture(scope="module")
def dspark_dir(target_dir, bigram, conf_table, tmp_path_factory):
    cfg = load_qwen3(target_dir).config
    v, h = cfg.vocab_size, cfg.hidden_size
    path = tmp_path_factory.mktemp("dspark")
    write_deepspec_dspark(str(path), target_layers=cfg.num_layers, vocab_size=v,
                          target_layer_ids=(-1, 3, 6), block_size=BLOCK, mask_token_id=3,
                          markov_rank=v, confidence=True, with_markov=True, seed=5)
    tensors = load_file(str(path / "model.safetensors"))
    tensors["markov_head.markov_w1.weight"] = 4 * np.eye(v, dtype=np.float32)  # [V, r = V]
    w2 = np.zeros((v, v), np.float32)  # torch [V out, r in]
    w2[bigram, np.arange(v)] = 10.0
    tensors["markov_head.markov_w2.weight"] = w2
    weight = np.zeros((1, h + v), np.float32)
    weight[0, h:] = conf_table[1]
    tensors["confidence_head.proj.weight"] = weight
    tensors["confidence_head.proj.bias"] = np.zeros(1, np.float32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)


@pytest.fixture(scope="module")
def static_engine(target_dir, dspark_dir):
    """Serial (overlap off; the aborts test runs it both ways): the device's proposals match
    the host's sequences after each step."""
    return Engine.from_pretrained(target_dir, dspark_dir, config=_config("static",
                                                                         overlap=False))


@pytest.fixture(scope="module")
def dynamic_engine(target_dir, dspark_dir, tmp_path_factory):
    path = fixed_costs(tmp_path_factory.mktemp("costs"), BUCKETS)
    return Engine.from_pretrained(target_dir, dspark_dir,
                                  config=_config("dynamic", cost_table_path=path))


@pytest.mark.parametrize("name", ["static_engine", "dynamic_engine"])
def test_greedy_dspark_equals_target_only(name, request, plain_engine):
    engine = request.getfixturevalue(name)
    assert isinstance(engine.drafter, DSparkDrafter)  # method inferred from config.json
    check_random_scenarios(engine, plain_engine, 4, name)
    assert engine.stats.totals.accepted > 0


@pytest.mark.parametrize("overlapped", [True, False], ids=["overlap", "serial"])
def test_aborts_and_seeded_sampling_stay_lossless(overlapped, static_engine, plain_engine):
    """Greedy and seeded temperature-1 requests (top-k or not; their drafts drawn row by row
    with the target's noise: coupled drafts, exact verification) emit the target-only seeded
    output, with aborts mid-flight, staggered arrivals and chunked prefills."""
    rng = np.random.default_rng(11 + overlapped)
    with overlap(static_engine, overlapped) as engine:
        check_churn(engine, plain_engine, rng, cases=3, sampled=True, label="dspark")


def test_the_markov_chain_drafts_and_the_head_sets_confidence(static_engine, bigram,
                                                               conf_table):
    """Each row drafts next(previous row's token) - the chain runs through the rows - and
    those drafts are accepted on the target's cycles; the proposal's confidence is the
    head's c_k of (h_k, x_{k-1}), here table[x_{k-1}]."""
    engine = static_engine
    for i, prompt in enumerate([CYCLING, [7, 8, 9], [100, 101]]):
        engine.add_request(f"m{i}", prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    checked, accepted = 0, 0
    while engine.has_unfinished_requests():
        accepted += sum(o.metrics.accepted for o in engine.step() if o.finished)
        tokens = np.asarray(engine.runner.state.draft_tokens)
        conf = np.asarray(engine.runner.state.draft_conf)
        proposal_len = np.asarray(engine.runner.state.proposal_len)
        for request in engine._requests.values():
            if request.finished or proposal_len[request.slot] == 0:
                continue
            bonus = (request.prompt_token_ids + request.output_token_ids)[-1]
            prev = [bonus] + tokens[request.slot, :K - 1].tolist()
            assert tokens[request.slot, :K].tolist() == [int(bigram[p]) for p in prev]
            np.testing.assert_allclose(conf[request.slot, :K], conf_table[0][prev], rtol=1e-5)
            checked += 1
    assert checked >= 12 and accepted >= 20


def test_k_beyond_the_block_is_refused_and_method_checked(target_dir, dspark_dir):
    with pytest.raises(ValueError, match=r"num_speculative_tokens=5 exceeds what one block of "
                                         r"the DSparkDrafter drafts: at most block_size = 4"):
        Engine.from_pretrained(target_dir, dspark_dir, config=_config(
            "static", verify_buckets=(24,), spec=dict(num_speculative_tokens=BLOCK + 1)))
    with pytest.raises(ValueError, match="method 'dflash' was asked for but .* holds a dspark "
                                         "drafter"):
        Engine.from_pretrained(target_dir, dspark_dir, config=_config(
            "static", spec=dict(method="dflash")))


@pytest.fixture
def probabilistic_engine(target_dir, dspark_dir):
    engine = Engine.from_pretrained(target_dir, dspark_dir, config=_config(
        "static", verify_buckets=(20,),
        spec=dict(verification="probabilistic", coupled_drafts=False, proposal_support=8)))
    yield engine
    del engine
    gc.collect()  # its executables' code maps: the suite runs near the kernel's cap


def test_probabilistic_verification(probabilistic_engine, plain_engine):
    """Rejection sampling against the Markov chain's row distributions (each row's q given the
    row before's draw): greedy requests stay token for token, sampled ones repeat."""
    rng = np.random.default_rng(4)
    prompts = [rng.integers(2, 250, size=int(rng.integers(1, 12))).tolist() for _ in range(6)]
    params = [SamplingParams(max_tokens=12, temperature=float(i % 2), seed=i, ignore_eos=True)
              for i in range(6)]
    runs = [[o.token_ids for o in probabilistic_engine.generate(prompts, params)]
            for _ in range(2)]
    assert runs[0] == runs[1] and probabilistic_engine.stats.totals.accepted > 0
    greedy = [i for i, p in enumerate(params) if p.greedy]
    plain = plain_engine.generate([prompts[i] for i in greedy], [params[i] for i in greedy])
    assert [runs[0][i] for i in greedy] == [o.token_ids for o in plain]
