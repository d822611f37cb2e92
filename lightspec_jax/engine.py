"""The serving engine: public API over the scheduler (host) and the compiled device steps.

    engine = Engine.from_pretrained(path, config=EngineConfig(max_num_seqs=16))
    outs = engine.generate(prompts, SamplingParams(max_tokens=64))

or, in a custom serving loop: add_request / step / abort / has_unfinished_requests.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Sequence

import numpy as np

from .buckets import CompileWatch, enable_compilation_cache
from .config import EngineConfig, Policy, SamplingParams
from .request import FinishReason, Request, RequestError, RequestOutput
from .drafters import Drafter
from .runner import PlainRunner
from .scheduler import Scheduler
from .spec_backend import SpecBackend
from .spec_runner import MAX_STOP_IDS
from .tokenizer import Tokenizer, load_eos_ids

log = logging.getLogger(__name__)


def _cache_len(max_model_len: int, block: int = 128, granule: int = 16) -> int:
    """KV strip length: whole attention blocks, so reads stop at the live context; short
    strips are one block rounded up to ``granule`` (the GPU attention kernel's smallest tile)."""
    step = granule if max_model_len <= block else block
    return -(-max_model_len // step) * step


class Engine:
    def __init__(self, model, *, config: EngineConfig = EngineConfig(),
                 tokenizer: Tokenizer | None = None, eos_token_ids: Sequence[int] = (),
                 drafter: Drafter | None = None):
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_size = model.config.vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.drafter = drafter
        speculative = config.speculative.policy is not Policy.NONE
        if speculative and drafter is None:
            raise ValueError(f"policy {config.speculative.policy.value!r} needs a drafter "
                             "(drafter_path=... or drafter=...)")
        start = time.perf_counter()
        if speculative:
            # Verify rows write up to K past seq_len and drafting up to K more.
            cache_len = _cache_len(config.max_model_len + 2 * config.speculative.num_speculative_tokens)
            self.backend = SpecBackend(model, drafter, config=config, cache_len=cache_len,
                                       prefill_buckets=config.buckets)
            what = (f"{len(config.buckets)} prefill buckets {list(config.buckets)} and "
                    f"{len(self.backend.verify_buckets)} verify buckets "
                    f"{list(self.backend.verify_buckets)}")
        else:
            self.backend = PlainRunner(model, num_slots=config.max_num_seqs,
                                       cache_len=_cache_len(config.max_model_len),
                                       buckets=config.buckets, show_progress=config.show_progress)
            what = f"{len(config.buckets)} plain-step buckets {list(config.buckets)}"
        self.compile_seconds = time.perf_counter() - start
        if config.synthetic_acceptance:
            log.warning("SYNTHETIC ACCEPTANCE (%s profile): verification outcomes are drawn, not "
                        "exact-matched; outputs are not the target's, only costs are real",
                        config.synthetic_acceptance)
            print(f"lightspec_jax: SYNTHETIC ACCEPTANCE MODE ({config.synthetic_acceptance}): "
                  "outputs are not the target's; for benchmarking device costs only")
        if config.show_progress:
            print(f"lightspec_jax: compiled {what} in {self.compile_seconds:.1f} s")
        self.scheduler = Scheduler(num_slots=config.max_num_seqs,
                                   max_rows=config.max_num_batched_tokens)
        self._requests: dict[str, Request] = {}  # live or not yet reported as finished
        self._in_flight = None  # a dispatched step not read yet (speculative backends)
        self._rng = np.random.default_rng(config.seed)
        self._auto_id = 0

    @classmethod
    def from_pretrained(cls, target_path: str, drafter_path: str | None = None, *,
                        config: EngineConfig = EngineConfig()) -> "Engine":
        """Loads a Qwen3 target (Hugging Face or converted directory; nothing is downloaded) and,
        optionally, a drafter for it: an Eagle3 drafter (Hugging Face layout: EAGLE/SpecForge
        or speculators) or a small Qwen3 causal LM sharing the target's vocabulary (a draft
        LM, as transformers' assisted generation uses), told apart by config.json."""
        from .checkpoint import DRAFT_LM, EAGLE3, drafter_kind, load_eagle3, load_qwen3
        from .drafters import DraftLMDrafter, Eagle3Drafter

        enable_compilation_cache(config.compilation_cache_dir)
        model = load_qwen3(target_path, dtype=config.dtype)
        kind = None if drafter_path is None else drafter_kind(drafter_path)
        drafter = None
        if kind == EAGLE3:
            # The target's embedding serves the drafter (SGLang's rule; Eagle3 training keeps
            # it frozen), so a stored copy of V x H values is not loaded.
            drafter = Eagle3Drafter(load_eagle3(drafter_path, target_config=model.config,
                                                dtype=config.dtype, load_embed=False))
        elif kind == DRAFT_LM:
            draft_model = load_qwen3(drafter_path, dtype=config.dtype)
            _check_same_vocabulary(target_path, model.config.vocab_size, drafter_path,
                                   draft_model.config.vocab_size)
            drafter = DraftLMDrafter(draft_model)
        tok_path = os.path.join(target_path, "tokenizer.json")
        tokenizer = Tokenizer.from_file(tok_path) if os.path.isfile(tok_path) else None
        eos = set(model.config.eos_token_ids) | load_eos_ids(target_path)
        return cls(model, config=config, tokenizer=tokenizer, eos_token_ids=sorted(eos),
                   drafter=drafter)

    # --- public API -------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | Sequence[int],
                    params: SamplingParams | None = None) -> None:
        """Queues a request; raises RequestError (and changes nothing) if it is invalid."""
        request = self._make_request(request_id, prompt, params or SamplingParams())
        self._requests[request.request_id] = request
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        """Stops a request; the next step() reports it finished with reason 'abort'."""
        request = self._requests.get(request_id)
        if request is None or request.finished:
            raise RequestError(f"cannot abort {request_id!r}: no unfinished request has this id")
        self.scheduler.finish(request, FinishReason.ABORT)

    @property
    def stats(self):
        """Speculative decoding statistics (EngineStats), or None in plain decoding."""
        return getattr(self.backend, "stats", None)

    @property
    def cost_profile(self):
        """The start-up bucket sweep (CostProfile), or None when the tables were loaded from
        `cost_table_path`, the policy needs no prices, or decoding is plain."""
        return getattr(self.backend, "profile", None)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or self._in_flight is not None

    def step(self) -> list[RequestOutput]:
        """Runs one engine step; returns each request that produced tokens or finished.

        With a speculative backend the step dispatches new device work before reading the
        previous step's results (one step in flight), so a request that finished is noticed
        a step late; its surplus tokens are dropped, never emitted.
        """
        with CompileWatch("Engine.step", enabled=self.config.forbid_recompile):
            touched: list[Request] = [r for r in self._requests.values() if r.finished]
            flight = None
            if self.scheduler.running or self.scheduler.waiting:
                batch = self.scheduler.schedule()
                for chunk in batch.prefills:  # counted at dispatch: never scheduled twice
                    chunk.request.num_prefilled += chunk.length
                if batch.num_rows:
                    flight = self.backend.dispatch(batch)
            if self.backend.overlap:
                flight, self._in_flight = self._in_flight, flight
            if flight is not None:
                touched += self._commit(self.backend.collect(flight))
            return [self._report(r) for r in dict.fromkeys(touched)]

    def generate(self, prompts: Sequence[str | Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Serves `prompts` to completion; outputs come back in prompt order."""
        if self.has_unfinished_requests():
            raise RuntimeError("generate() needs an idle engine: requests added with "
                               "add_request() are still unfinished (drive them with step())")
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("generate() takes a list of prompts; wrap a single prompt in a list")
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        requests = []
        for prompt, p in zip(prompts, params):  # validate everything before queueing anything
            self._auto_id += 1
            requests.append(self._make_request(f"generate-{self._auto_id}", prompt, p,
                                               pending=requests))
        for request in requests:
            self._requests[request.request_id] = request
            self.scheduler.add(request)
        results: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests():
            for out in self.step():
                if out.finished:
                    results[out.request_id] = out
        return [results[r.request_id] for r in requests]

    # --- internals --------------------------------------------------------------------------

    def _make_request(self, request_id, prompt, params, pending=()) -> Request:
        if not isinstance(request_id, str) or not request_id:
            raise RequestError(f"request_id must be a non-empty str, got {request_id!r}")
        if request_id in self._requests or any(r.request_id == request_id for r in pending):
            raise RequestError(f"duplicate request id {request_id!r}: a request with this id "
                               "is still unfinished")
        if not isinstance(params, SamplingParams):
            raise RequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        tokens = self._tokenize(request_id, prompt)
        limit = self.config.max_model_len
        if len(tokens) >= limit:
            raise RequestError(f"request {request_id!r}: prompt has {len(tokens)} tokens; "
                               f"max_model_len={limit} leaves no room to generate (need < {limit})")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"request {request_id!r}: token id {bad[0]} is outside the "
                               f"vocabulary [0, {self.vocab_size})")
        bad_stops = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad_stops:
            raise RequestError(f"request {request_id!r}: stop token id {bad_stops[0]} is outside "
                               f"the vocabulary [0, {self.vocab_size})")
        seed = params.seed if params.seed is not None else int(self._rng.integers(0, 2**32))
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)
        if len(stops) > MAX_STOP_IDS:
            raise RequestError(f"request {request_id!r}: {len(stops)} stop ids (EOS included); "
                               f"at most {MAX_STOP_IDS} are supported")
        return Request(request_id=request_id, prompt_token_ids=tokens, params=params, seed=seed,
                       stop_ids=frozenset(stops))

    def _tokenize(self, request_id: str, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError(f"request {request_id!r}: string prompts need a tokenizer.json "
                                   "beside the checkpoint; pass token ids instead")
            tokens = self.tokenizer.encode(prompt)
        else:
            try:
                tokens = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise RequestError(f"request {request_id!r}: prompt must be a str or a sequence "
                                   f"of ints, got {type(prompt).__name__}") from None
            if any(not isinstance(t, (int, np.integer)) for t in prompt):
                raise RequestError(f"request {request_id!r}: prompt token ids must be ints")
        if not tokens:
            raise RequestError(f"request {request_id!r}: empty prompt")
        return tokens

    def _commit(self, new_tokens: list[tuple[Request, list[int]]]) -> list[Request]:
        """Applies one step's tokens to host state; returns the requests that changed.

        The host applies the stop rules token by token; it is the authority on what a request
        emits (the device already cut speculative spans at stop ids and allowances)."""
        changed = []
        for request, tokens in new_tokens:
            if request.finished:  # aborted while its step was in flight
                continue
            for token in tokens:
                request.output_token_ids.append(token)
                reason = self._finish_reason(request, token)
                if reason is not None:
                    self.scheduler.finish(request, reason)
                    break
            changed.append(request)
        return changed

    def _finish_reason(self, request: Request, token: int) -> FinishReason | None:
        if token in request.stop_ids:
            return FinishReason.STOP
        if (len(request.output_token_ids) >= request.params.max_tokens
                or request.total_len >= self.config.max_model_len):
            return FinishReason.LENGTH
        return None

    def _report(self, request: Request) -> RequestOutput:
        if request.finished:
            self._requests.pop(request.request_id, None)
        text = self.tokenizer.decode(request.output_token_ids) if self.tokenizer else None
        return request.report(text)


def _check_same_vocabulary(target_path: str, target_vocab: int, draft_path: str,
                           draft_vocab: int) -> None:
    """A draft LM proposes token ids the target verifies as its own, so both must number the
    same tokens alike: equal vocab_size and, when both ship a tokenizer.json, the same
    token -> id map (another tokenizer would still be lossless, but rarely accepted)."""
    from .checkpoint import CheckpointError

    if draft_vocab != target_vocab:
        raise CheckpointError(
            f"draft LM {draft_path} has vocab_size={draft_vocab}, the target {target_path} "
            f"has {target_vocab}: a draft LM must share the target's vocabulary (same tokenizer)")
    paths = [os.path.join(p, "tokenizer.json") for p in (target_path, draft_path)]
    if all(os.path.isfile(p) for p in paths):
        from tokenizers import Tokenizer as HFTokenizer

        target_map, draft_map = (HFTokenizer.from_file(p).get_vocab(with_added_tokens=True)
                                 for p in paths)
        if target_map != draft_map:
            differ = sorted(set(target_map.items()) ^ set(draft_map.items()))
            raise CheckpointError(
                f"the draft LM's tokenizer ({paths[1]}) maps tokens to ids unlike the "
                f"target's ({paths[0]}): {len(differ)} (token, id) pairs differ, e.g. "
                f"{differ[0]!r}; a draft LM must share the target's tokenizer")
