"""A step-API soak: thousands of requests through one dynamic engine on the shipped tiny pair.

Random prompt lengths, allowances, temperatures and stop ids; aborts of live requests; bad
requests (empty prompts, ids outside the vocabulary, duplicate ids, aborts of unknown ids,
prompts longer than max_model_len) interleaved with the good ones. It checks that nothing is
lost (every accepted request is reported finished exactly once, with a reason that matches
its tokens), that every slot is returned, and that resident memory stays flat after warm-up.

    python benchmarks/soak.py --requests 10000 --out soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "lightspec_jax", "assets", "tiny-pair")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-depth", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=1000, help="requests before the RSS baseline")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from lightspec_jax import (Engine, EngineConfig, RequestError, SamplingParams,
                               SpeculativeConfig)
    from lightspec_jax.engine.buckets import concurrency_buckets

    c, k = args.concurrency, args.max_depth
    config = EngineConfig(max_num_seqs=c, max_model_len=192, dtype="float32",
                          max_num_batched_tokens=128,
                          speculative=SpeculativeConfig(policy="dynamic", num_speculative_tokens=k),
                          verify_buckets=concurrency_buckets(c, k))
    engine = Engine.from_pretrained(os.path.join(ASSETS, "target"), os.path.join(ASSETS, "drafter"),
                                    config=config)
    vocab = engine.vocab_size
    rng = np.random.default_rng(args.seed)
    live: dict[str, SamplingParams] = {}
    finished: dict[str, str] = {}
    bad = {"refused": 0, "tried": 0}
    added = aborted = tokens = steps = 0
    rss = []  # (requests added, MiB)
    start = time.perf_counter()

    def expect_refusal(action) -> None:
        bad["tried"] += 1
        try:
            action()
        except RequestError:
            bad["refused"] += 1

    while added < args.requests or engine.has_unfinished_requests():
        while added < args.requests and len(live) < 2 * c:
            rid = f"soak-{added}"
            params = SamplingParams(
                max_tokens=int(rng.integers(1, 48)),
                temperature=float(rng.choice([0.0, 0.0, 0.8])), seed=int(rng.integers(1 << 31)),
                top_k=int(rng.choice([0, 0, 20])),
                stop_token_ids=tuple(int(t) for t in rng.integers(0, vocab, rng.integers(0, 3))))
            prompt = rng.integers(0, vocab, size=int(rng.integers(1, 120))).tolist()
            engine.add_request(rid, prompt, params)
            live[rid] = params
            added += 1
            if added % 500 == 0:
                rss.append((added, rss_mib()))
            if rng.random() < 0.05:  # a bad request next to the good ones
                kind = rng.integers(5)
                if kind == 0:
                    expect_refusal(lambda: engine.add_request(f"bad-{added}", [], params))
                elif kind == 1:
                    expect_refusal(lambda: engine.add_request(f"bad-{added}", [vocab + 3], params))
                elif kind == 2:
                    expect_refusal(lambda: engine.add_request(rid, [1, 2], params))  # duplicate
                elif kind == 3:
                    expect_refusal(lambda: engine.abort(f"never-{added}"))
                else:
                    expect_refusal(lambda: engine.add_request(f"bad-{added}", [5] * 500, params))
        if live and rng.random() < 0.03:
            victim = str(rng.choice(sorted(live)))
            engine.abort(victim)
            aborted += 1
        for out in engine.step():
            tokens += len(out.new_token_ids)
            if out.finished:
                if out.request_id in finished:
                    raise AssertionError(f"{out.request_id} reported finished twice")
                params = live.pop(out.request_id)
                finished[out.request_id] = out.finish_reason
                ids = out.token_ids
                if out.finish_reason == "length" and len(ids) != params.max_tokens:
                    raise AssertionError(f"{out.request_id}: length finish at {len(ids)} tokens, "
                                         f"max_tokens {params.max_tokens}")
                if out.finish_reason == "stop" and ids[-1] not in engine.eos_token_ids | set(
                        params.stop_token_ids):
                    raise AssertionError(f"{out.request_id}: stop finish on token {ids[-1]}")
        steps += 1
    wall = time.perf_counter() - start
    lost = sorted(set(f"soak-{i}" for i in range(added)) - set(finished))
    sched = engine.scheduler
    free_slots = c - len(sched.running)
    base = next((m for n, m in rss if n >= args.warmup), rss[0][1] if rss else rss_mib())
    peak_after = max((m for n, m in rss if n >= args.warmup), default=base)
    result = {
        "requests": added, "finished": len(finished), "lost": len(lost), "aborted": aborted,
        "reasons": {r: list(finished.values()).count(r) for r in ("stop", "length", "abort")},
        "bad_requests_tried": bad["tried"], "bad_requests_refused": bad["refused"],
        "free_slots_at_end": free_slots, "slots": c, "steps": steps, "tokens": tokens,
        "wall_s": wall, "tok_s": tokens / wall,
        "rss_mib_after_warmup": base, "rss_mib_peak_after_warmup": peak_after,
        "rss_growth": peak_after / base - 1, "rss_samples": rss,
        "host_ms_per_step": engine.stats.summary()["host_ms_per_step"],
    }
    ok = (not lost and free_slots == c and bad["refused"] == bad["tried"]
          and result["rss_growth"] < 0.10)
    result["ok"] = ok
    print(json.dumps({k: v for k, v in result.items() if k != "rss_samples"}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if not ok:
        raise SystemExit("soak FAILED: " + ("lost requests " if lost else "")
                         + ("slots not returned " if free_slots != c else "")
                         + ("bad request accepted " if bad["refused"] != bad["tried"] else "")
                         + ("memory grew" if result["rss_growth"] >= 0.10 else ""))


if __name__ == "__main__":
    main()
