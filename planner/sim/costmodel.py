"""Ground-truth step times for the simulator: an H200 roofline, or measured tables from a file.

Roofline (H200, Qwen3-14B bf16 target, Eagle3 drafter). Matmuls and attention run as separate
kernels, so each is its own roofline and their times add:
  target(B rows, C context tokens, N requests) =
      max(weight bytes / BW, B * 2 * params / FLOPS)                     # projections, MLP, head
    + max(C * KV bytes per token / BW, B * (C / N) * attention FLOPs / FLOPS)   # attention
    + fixed per-step overhead
with BW = 4.8 TB/s and FLOPS = 790 TFLOP/s (bf16). A draft forward is the same with the
drafter's sizes. Shapes run padded to their compiled bucket, so draft forwards over N rows are
priced at the bucket holding N.

Overheads are calibrated on public figures (peers.md §2):
* target: SafeAILab/EAGLE#244 measured Qwen3-8B at 186 tok/s (batch 1, SGLang, one H200);
  1000/186 ms minus Qwen3-8B's weight-read time leaves 2.2 ms per step;
* draft: vllm#20780 (Llama-3.1-8B + EAGLE-3, H100, batch 1): vanilla 7.07 ms/token, K=4 gives
  4.05 ms/token at acceptance length 3.08, so 4 draft forwards took 4.05*3.08 - 7.07 = 5.40 ms,
  1.35 ms each; minus that drafter's weight-read time at 3.35 TB/s leaves 1.1 ms per forward.

Host time per step (scheduling, planning, reading back and emitting tokens), by the N requests
in the step: host(N) = HOST_BASE_MS + HOST_PER_REQUEST_MS * N. It does not depend on rows or
depth. The serving loop overlaps it with the device (a step costs max(device, host)), or adds
it without overlap. From this project's measurements (BENCHMARKS.md):
* base 1.0 ms: this CPU's engine loop spends 0.95 ms of host time per static K=3 step at c=1
  ("The engine loop's tax", host ms after the rewrite);
* 0.06 ms per request: on the H200 at c=256 (BENCHMARKS.md, "The H200 device check", run 3) a
  speculative step took 16 ms of wall whether its device work was 6.7 ms (dynamic) or 9.5 ms
  (static K=3): a host-bound overlapped loop, so host(256) ~ 16 ms, (16 - 1) / 256 ~ 0.06.
  The same CPU loop measured 2.7 ms at c=256 (0.0067 ms per request): the H200 figure is the
  pessimistic one, chosen because the roofline models that machine; `host_per_request_ms`
  (CLI --host-per-request-ms 0.0067) gives the CPU's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..costs import CostTable

_BYTES = 2  # bf16


def _decoder_params(*, hidden: int, inter: int, q_dim: int, kv_dim: int, attn_in: int) -> int:
    return attn_in * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * inter


def _qwen3_params(*, layers, hidden, inter, q_dim, kv_dim, vocab) -> int:
    """Parameters read per decode step (the input embedding is gathered, not streamed)."""
    layer = _decoder_params(hidden=hidden, inter=inter, q_dim=q_dim, kv_dim=kv_dim,
                            attn_in=hidden)
    return layers * layer + vocab * hidden


def _eagle3_params(*, hidden, inter, q_dim, kv_dim, draft_vocab) -> int:
    """One decoder layer fed [embedding; hidden] (2H wide), the fc over 3 target layers, head."""
    layer = _decoder_params(hidden=hidden, inter=inter, q_dim=q_dim, kv_dim=kv_dim,
                            attn_in=2 * hidden)
    return layer + 3 * hidden * hidden + draft_vocab * hidden


QWEN3_14B_PARAMS = _qwen3_params(layers=40, hidden=5120, inter=17408, q_dim=5120, kv_dim=1024,
                                 vocab=151936)
QWEN3_8B_PARAMS = _qwen3_params(layers=36, hidden=4096, inter=12288, q_dim=4096, kv_dim=1024,
                                vocab=151936)
EAGLE3_QWEN3_14B_PARAMS = _eagle3_params(hidden=5120, inter=17408, q_dim=5120, kv_dim=1024,
                                         draft_vocab=32000)
EAGLE3_LLAMA31_8B_PARAMS = _eagle3_params(hidden=4096, inter=14336, q_dim=4096, kv_dim=1024,
                                          draft_vocab=32000)

H200_BYTES_PER_MS = 4.8e12 / 1e3
H200_FLOPS_PER_MS = 790e12 / 1e3
H100_BYTES_PER_MS = 3.35e12 / 1e3

TARGET_OVERHEAD_MS = 1000.0 / 186.0 - QWEN3_8B_PARAMS * _BYTES / H200_BYTES_PER_MS
DRAFT_OVERHEAD_MS = (4.05 * 3.08 - 7.07) / 4 - EAGLE3_LLAMA31_8B_PARAMS * _BYTES / H100_BYTES_PER_MS
HOST_BASE_MS = 1.0
HOST_PER_REQUEST_MS = (16.0 - HOST_BASE_MS) / 256


@dataclass(frozen=True, kw_only=True)
class RooflineCostModel:
    """H200 + Qwen3-14B bf16 + Eagle3; all times in ms."""

    bytes_per_ms: float = H200_BYTES_PER_MS
    flops_per_ms: float = H200_FLOPS_PER_MS
    target_params: int = QWEN3_14B_PARAMS
    target_kv_bytes_per_token: int = 40 * 2 * 1024 * _BYTES  # layers x (K, V) x kv_dim
    target_attn_flops: int = 40 * 2 * 2 * 5120  # per (query row, context token)
    target_overhead_ms: float = TARGET_OVERHEAD_MS
    draft_params: int = EAGLE3_QWEN3_14B_PARAMS
    draft_kv_bytes_per_token: int = 1 * 2 * 1024 * _BYTES
    draft_attn_flops: int = 1 * 2 * 2 * 5120
    draft_overhead_ms: float = DRAFT_OVERHEAD_MS
    host_base_ms: float = HOST_BASE_MS
    host_per_request_ms: float = HOST_PER_REQUEST_MS
    name: str = "roofline-h200-qwen3-14b-eagle3"

    def _forward(self, rows, context, requests, params, kv_bytes, attn_flops, overhead):
        dense = max(params * _BYTES / self.bytes_per_ms, rows * 2 * params / self.flops_per_ms)
        per_request = context / max(requests, 1)
        attention = max(context * kv_bytes / self.bytes_per_ms,
                        rows * per_request * attn_flops / self.flops_per_ms)
        return dense + attention + overhead

    def target_ms(self, rows: int, context: float, requests: int) -> float:
        return self._forward(rows, context, requests, self.target_params,
                             self.target_kv_bytes_per_token, self.target_attn_flops,
                             self.target_overhead_ms)

    def draft_ms(self, rows: int, context: float, requests: int) -> float:
        """One draft forward over `rows` rows."""
        return self._forward(rows, context, requests, self.draft_params,
                             self.draft_kv_bytes_per_token, self.draft_attn_flops,
                             self.draft_overhead_ms)

    def host_ms(self, requests: int) -> float:
        """Host ms of a decode step with N requests (module docstring)."""
        return self.host_base_ms + self.host_per_request_ms * requests

    def prefill_ms(self, prompt_tokens: int) -> float:
        """Marginal cost of a prompt chunked into a decode step: compute on its tokens (the
        step reads the weights anyway), causal attention over itself, and the drafter's pass."""
        p = float(prompt_tokens)
        flops = (p * 2 * (self.target_params + self.draft_params)
                 + p * p / 2 * (self.target_attn_flops + self.draft_attn_flops))
        return flops / self.flops_per_ms


@dataclass(frozen=True, kw_only=True)
class TableCostModel:
    """Ground truth from measured tables (e.g. written by a CPU or GPU profiling run)."""

    target: CostTable
    draft: CostTable
    host: CostTable | None = None  # host ms per step keyed by requests N; None: no host time
    name: str = "table"

    @classmethod
    def load(cls, path: str | os.PathLike) -> TableCostModel:
        """A JSON file {"target": <CostTable JSON>, "draft": <CostTable JSON>} and optionally
        "host": <CostTable JSON keyed by requests>; a file without "host" has no host time."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        missing = {"target", "draft"} - set(data)
        if missing:
            raise ValueError(f"{path}: cost table file needs keys 'target' and 'draft', "
                             f"missing {sorted(missing)}")
        target, draft = CostTable.from_json(data["target"]), CostTable.from_json(data["draft"])
        if target.is_empty or draft.is_empty:
            raise ValueError(f"{path}: the target and draft tables must not be empty")
        host = CostTable.from_json(data["host"]) if "host" in data else None
        if host is not None and host.is_empty:
            raise ValueError(f"{path}: the host table must not be empty (leave the key out "
                             "for no host time)")
        return cls(target=target, draft=draft, host=host, name=f"table:{os.path.basename(path)}")

    def save(self, path: str | os.PathLike) -> None:
        data = {"target": self.target.to_json(), "draft": self.draft.to_json()}
        if self.host is not None:
            data["host"] = self.host.to_json()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)

    def target_ms(self, rows: int, context: float, requests: int) -> float:
        return self.target.estimate(rows, context)

    def draft_ms(self, rows: int, context: float, requests: int) -> float:
        return self.draft.estimate(rows, context)

    def host_ms(self, requests: int) -> float:
        return 0.0 if self.host is None else self.host.estimate(requests)

    def prefill_ms(self, prompt_tokens: int) -> float:
        return max(0.0, self.target.estimate(prompt_tokens, 0) - self.target.estimate(1, 0))


def profile_tables(model, buckets, *, context_len: int = 0) -> tuple[CostTable, CostTable]:
    """Start-up profile: time every bucket once at a small context, like LightLLM's
    2-token dummy requests. Returns (target, draft) tables with a context axis."""
    target = CostTable({b: model.target_ms(b, context_len, b) for b in buckets},
                       context_len=context_len)
    draft = CostTable({b: model.draft_ms(b, context_len, b) for b in buckets},
                      context_len=context_len)
    return target, draft


def profile_host(model, buckets) -> CostTable:
    """Start-up profile of host time, one step per request count in `buckets` (context-free:
    host work follows requests, not KV). Empty if the model has no host time."""
    ms = {b: model.host_ms(b) for b in buckets}
    return CostTable({b: v for b, v in ms.items() if v > 0})
