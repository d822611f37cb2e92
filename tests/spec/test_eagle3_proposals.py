"""The Eagle3 drafter inside the engine proposes exactly what an offline sequential run gives.

After every engine step, each slot's device proposal must equal an offline computation from
the committed sequence alone: target features for positions 0..n-1 from one full forward, one
Eagle3 step-0 pass over (h_p, x_{p+1}), then chained steps from the carried state. This checks
the commit forward's alignment and that stale draft KV from rejected rows never leaks.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lightspec_jax import SamplingParams

ROWS = 64  # every offline pass is padded to this many rows (padding: slot 1, dropped)


@functools.partial(jax.jit, static_argnames=("graphs", "depth"))
def _offline(states, seq, n, *, graphs, depth):
    target, drafter = (nnx.merge(g, s) for g, s in zip(graphs, states))
    rows = jnp.arange(ROWS, dtype=jnp.int32)
    slots = jnp.where(rows < n, 0, 1)
    feats = target(seq[:ROWS], rows, slots, target.new_cache(num_slots=1, max_len=128),
                   aux_layers=drafter.config.aux_layer_ids).aux_hidden
    out = drafter(seq[1:ROWS + 1], feats, rows, slots, drafter.new_cache(num_slots=1, max_len=128),
                  embed=target.embed[...], from_features=True, logits_rows=(n - 1)[None])
    token = drafter.draft_to_target(jnp.argmax(out.logits, axis=-1))
    state, dcache, drafts = out.state, out.cache, [token]
    for k in range(1, depth):
        out = drafter(token, state, (n - 1 + k)[None], jnp.zeros(1, jnp.int32), dcache,
                      embed=target.embed[...], from_features=False)
        token = drafter.draft_to_target(jnp.argmax(out.logits, axis=-1))
        state, dcache = out.state, out.cache
        drafts.append(token)
    return jnp.concatenate(drafts)


def offline_proposal(target, drafter_module, seq, depth):
    """Drafts from the committed sequence alone: seq_len n = len(seq) - 1 (the newest token's
    KV is not committed), features h_0..h_{n-1}, Eagle3 rows (h_p, x_{p+1}) at positions p."""
    (tg, ts), (dg, ds) = nnx.split(target), nnx.split(drafter_module)
    padded = np.zeros(ROWS + 1, np.int32)
    padded[:len(seq)] = seq
    out = _offline((ts, ds), jnp.asarray(padded), jnp.int32(len(seq) - 1), graphs=(tg, dg),
                   depth=depth)
    return np.asarray(out).tolist()


def test_engine_proposals_match_offline_eagle3(spec_engines):
    engine = spec_engines("eagle3_k5")
    drafter = engine.drafter
    module = drafter.module(drafter.param_leaves)
    depth = engine.config.speculative.num_speculative_tokens
    rng = np.random.default_rng(11)
    for i in range(4):
        engine.add_request(f"p{i}", rng.integers(2, 250, size=int(rng.integers(3, 30))).tolist(),
                           SamplingParams(max_tokens=14, ignore_eos=True))
    checked = 0
    while engine.has_unfinished_requests():
        engine.step()
        state = engine.runner.state
        device = np.asarray(state.draft_tokens)
        proposal_len = np.asarray(state.proposal_len)
        for request in engine._requests.values():
            if request.finished or proposal_len[request.slot] == 0:
                continue
            seq = request.prompt_token_ids + request.output_token_ids
            want = offline_proposal(engine.model, module, seq, depth)
            assert device[request.slot, :depth].tolist() == want, request.request_id
            checked += 1
    assert checked >= 12
