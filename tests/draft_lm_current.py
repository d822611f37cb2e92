"""The draft LM's cache is current: at every committed position of a decoding slot its K/V
equal a forward over the committed tokens from scratch. Floor steps only record their rows
(drafters/base.py); the catch-up before the next step that commits must leave exactly this.
Shared by the single-device floor test and the data-parallel mesh check, which both serve
through `serve_checking_current`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lightspec_jax.models import KVCache


_FORWARDS: dict = {}  # id(drafter) -> its jitted from-scratch forward (one compile per shape)


def _from_scratch(drafter):
    """(param leaves, tokens [N, S]) -> the draft model's (K, V) [L, N, S, G, D] after one
    forward over every slot's S positions into an empty cache: at a position p a causal
    forward depends on tokens[:, :p + 1] alone, so what follows a slot's committed tokens
    (padding) changes nothing before it."""
    if id(drafter) not in _FORWARDS:
        def forward(leaves, tokens):
            model = drafter.module(leaves)
            n, s = tokens.shape
            c = model.config
            fresh = KVCache.init(num_layers=c.num_layers, num_slots=n, max_len=s,
                                 num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                                 dtype=leaves[0].dtype)
            out = model(tokens.reshape(-1), jnp.tile(jnp.arange(s), n),
                        jnp.repeat(jnp.arange(n), s), fresh,
                        logits_rows=jnp.zeros((1,), jnp.int32)).cache
            return out.k, out.v
        _FORWARDS[id(drafter)] = jax.jit(forward)
    return _FORWARDS[id(drafter)]


def check_draft_lm_current(engine, committed: dict[int, list[int]], *, tol: float = 2e-5) -> int:
    """committed: slot -> the tokens its request has committed so far, at least through the
    slot's committed length (prompt, then output). Raises AssertionError where the draft
    model's cache differs; returns how many slots it checked (the active ones)."""
    runner = engine.runner
    dcache, state = runner.dcache, runner.state
    seq_len, length = np.asarray(state.seq_len), np.asarray(dcache.length)
    active = np.asarray(state.active)
    kv_k, kv_v = np.asarray(dcache.kv.k), np.asarray(dcache.kv.v)  # [L, N, S, G, D]
    recorded = np.asarray(dcache.tokens)  # [N, S]
    tokens = np.zeros(recorded.shape, np.int32)
    checks = {}  # slot -> committed length
    for slot, ids in committed.items():
        if active[slot]:
            n = checks[slot] = int(seq_len[slot])
            tokens[slot, :n] = ids[:n]
    if not checks:
        return 0
    want = [np.asarray(x) for x in _from_scratch(engine.drafter)(runner._d_leaves, tokens)]
    for slot, n in checks.items():
        assert length[slot] == n, f"slot {slot}: draft cache current to {length[slot]}, not {n}"
        assert recorded[slot, :n].tolist() == tokens[slot, :n].tolist(), \
            f"slot {slot}: recorded tokens differ"
        for got, exp in zip((kv_k, kv_v), want):
            np.testing.assert_allclose(got[:, slot, :n], exp[:, slot, :n], rtol=tol, atol=tol,
                                       err_msg=f"slot {slot}: draft K/V differ")
    return len(checks)


def serve_checking_current(engine, prompts: dict[str, list[int]], ref: dict[str, list[int]],
                           params) -> tuple[dict[str, list[int]], int, int]:
    """Serves `prompts` (request id -> prompt) step by step; after every step whose plan
    drafted, checks that the draft model is current for each decoding slot, against the
    prompt and `ref`'s output (what plain decoding produced). Returns (each request's output
    tokens, steps that drafted nothing, slots checked)."""
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, params)
    requests = {rid: engine._requests[rid] for rid in prompts}
    outs = {rid: [] for rid in prompts}
    floors = checked = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] += out.new_token_ids
        flight = engine._in_flight
        if flight is None or flight.plan is None:
            continue
        floors += flight.plan.draft_depth == 0
        if flight.plan.draft_depth:  # the step just dispatched committed and drafted
            checked += check_draft_lm_current(engine, {
                r.slot: prompts[rid] + ref[rid] for rid, r in requests.items()
                if r.slot is not None})
    return outs, floors, checked
