"""The draft LM's cache is current: at every committed position of a decoding slot its K/V
equal a forward over the committed tokens from scratch. Floor steps only record their rows
(drafters/base.py); the catch-up before the next step that commits must leave exactly this.
Shared by the single-device floor test and the data-parallel mesh check, which both serve
through `serve_checking_current`."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lightspec_jax.models import KVCache


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
    model = engine.drafter.module(engine.drafter.param_leaves)
    checked = 0
    for slot, tokens in committed.items():
        if not active[slot]:
            continue
        n = int(seq_len[slot])
        assert length[slot] == n, f"slot {slot}: draft cache current to {length[slot]}, not {n}"
        assert recorded[slot, :n].tolist() == tokens[:n], f"slot {slot}: recorded tokens differ"
        fresh = KVCache.init(num_layers=kv_k.shape[0], num_slots=1, max_len=kv_k.shape[2],
                             num_kv_heads=kv_k.shape[3], head_dim=kv_k.shape[4],
                             dtype=dcache.kv.k.dtype)
        want = model(jnp.asarray(tokens[:n]), jnp.arange(n), jnp.zeros(n, jnp.int32), fresh,
                     logits_rows=jnp.zeros((1,), jnp.int32)).cache
        for got, exp in ((kv_k, want.k), (kv_v, want.v)):
            np.testing.assert_allclose(got[:, slot, :n], np.asarray(exp[:, 0, :n]), rtol=tol,
                                       atol=tol, err_msg=f"slot {slot}: draft K/V differ")
        checked += 1
    return checked


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
