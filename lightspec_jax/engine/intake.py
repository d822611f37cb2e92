"""Request intake: a prompt and its sampling values checked and turned into a Request.

Everything a request can get wrong raises RequestError here, at the call that made it, before
anything is queued; other requests are never affected.
"""

from __future__ import annotations

import numpy as np

from ..config import SamplingParams
from ..errors import RequestError
from ..request import Request
from ..tokenizer import IncrementalDetokenizer
from .batch import MAX_STOP_IDS


def make_request(request_id, prompt, params, *, who: str | None, draw_seed, tokenizer,
                 vocab_size: int, max_model_len: int, eos_token_ids) -> Request:
    """Validates and builds a request; errors name it as `who` (default: its id).
    `draw_seed()` gives a request without its own seed the engine's next one (drawn only once
    the request is valid, so refused requests do not shift the sequence)."""
    who = who or f"request {request_id!r}"
    if not isinstance(request_id, str) or not request_id:
        raise RequestError(f"request_id must be a non-empty str, got {request_id!r}")
    if not isinstance(params, SamplingParams):
        raise RequestError(f"params must be a SamplingParams, got {type(params).__name__}")
    tokens = _tokenize(who, prompt, tokenizer)
    if len(tokens) >= max_model_len:
        raise RequestError(f"{who}: prompt has {len(tokens)} tokens; max_model_len="
                           f"{max_model_len} leaves no room to generate (need < {max_model_len})")
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"{who}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    bad_stops = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad_stops:
        raise RequestError(f"{who}: stop token id {bad_stops[0]} is outside the vocabulary "
                           f"[0, {vocab_size})")
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    if len(stops) > MAX_STOP_IDS:
        raise RequestError(f"{who}: {len(stops)} stop ids (EOS included); at most "
                           f"{MAX_STOP_IDS} are supported")
    return Request(request_id=request_id, prompt_token_ids=tokens, params=params,
                   seed=params.seed if params.seed is not None else draw_seed(),
                   stop_ids=frozenset(stops),
                   allowance=min(params.max_tokens, max_model_len - len(tokens)),
                   detokenizer=tokenizer and IncrementalDetokenizer(tokenizer))


def _tokenize(who: str, prompt, tokenizer) -> list[int]:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RequestError(f"{who}: string prompts need a tokenizer.json beside the "
                               "checkpoint; pass token ids instead")
        tokens = tokenizer.encode(prompt)
    else:
        try:
            tokens = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise RequestError(f"{who}: prompt must be a str or a sequence of ints, got "
                               f"{type(prompt).__name__}") from None
        if any(not isinstance(t, (int, np.integer)) for t in prompt):
            raise RequestError(f"{who}: prompt token ids must be ints")
    if not tokens:
        raise RequestError(f"{who}: empty prompt")
    return tokens
