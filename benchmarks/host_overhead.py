"""The loop's tax: ms per engine step on a near-free model, speculative vs plain, by concurrency.

A random Qwen3 target with hidden size 32 (8 layers, vocab 512) and an Eagle3 drafter for it,
float32 on this CPU: the device work of a step is tiny, so what a step costs beyond a plain
step is the host loop's work (scheduling, input building, readback, bookkeeping) and the
number of executables dispatched. Speculative policies use synthetic acceptance (the chat
profile), so a step commits several tokens, as with a real drafter, at no model cost.

Every request decodes for the whole timed window (EOS ignored, long allowance): after its
prompts are prefilled and `--warmup` more steps (first proposals), `--steps` steps are timed through the
public step() API, interleaved over policies and repeated `--repeats` times; the median is
reported. Host ms per step comes from the engine's own step records (time the host spent in
step() not blocked on the device) where the engine keeps them; an engine without them
reports none.

With `--churn LO HI` requests end instead after LO-HI tokens each (seeded, the same for every
policy) and a new one takes each ended one's place, so the batch gains and loses requests
every step, as a serving batch does; the warm-up is then at least HI steps. A policy
`NAME:K@REV` plans with the planner package of git revision REV (planner_replay.planner_at),
to compare a planner change with its predecessor side by side, and `dynamic:K/dD` drafts D
after every step (ab_variants.force_depth: what each depth really costs the loop, against the
planner's free choice):

    python benchmarks/host_overhead.py --concurrency 64 --repeats 6 \
        --policies none dynamic:7/d0 dynamic:7/d1 dynamic:7/d2 dynamic:7

    python benchmarks/host_overhead.py --concurrency 1 64 256 --out host_overhead.json
    python benchmarks/host_overhead.py --concurrency 256 --steps 200 --repeats 4 \
        --churn 16 48 --policies none dynamic:7@HEAD~1 dynamic:7
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

POLICIES = ("none", "static:3", "dynamic:7")
SHAPE = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=8, num_heads=2,
             num_kv_heads=1, head_dim=16)


def build_engine(policy: str, concurrency: int, max_model_len: int, **config):
    """The near-free pair's engine; `config`: further EngineConfig fields."""
    from flax import nnx

    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
    from lightspec_jax.engine.buckets import concurrency_buckets
    from lightspec_jax.drafters import Eagle3Drafter
    from lightspec_jax.models import Eagle3, Eagle3Config, Qwen3, Qwen3Config

    cfg = Qwen3Config(**SHAPE)
    target = Qwen3(cfg, rngs=nnx.Rngs(0))
    policy, _, forced = policy.partition("/d")
    policy, _, revision = policy.partition("@")
    name, _, k = policy.partition(":")
    if forced and name != "dynamic":  # before minutes of compiling, not after
        raise SystemExit(f"{policy}/d{forced}: only a dynamic planner's depth can be forced")
    spec, drafter, extra = SpeculativeConfig(), None, {}
    if name != "none":
        depth = int(k)
        spec = SpeculativeConfig(policy=name, num_speculative_tokens=depth)
        drafter = Eagle3Drafter(Eagle3(Eagle3Config.for_target(cfg), rngs=nnx.Rngs(1)))
        extra = dict(synthetic_acceptance="chat",
                     verify_buckets=concurrency_buckets(concurrency, depth))
    config = EngineConfig(max_num_seqs=concurrency, max_model_len=max_model_len,
                          dtype="float32", speculative=spec,
                          max_num_batched_tokens=max(64, concurrency), show_progress=False,
                          **extra, **config)
    if not revision:
        engine = Engine(target, config=config, drafter=drafter)
    else:
        import lightspec_jax.engine.planning as planning_module
        from planner_replay import make_planner_at

        today = planning_module.make_planner
        planning_module.make_planner = make_planner_at(revision)
        try:
            engine = Engine(target, config=config, drafter=drafter)
        finally:
            planning_module.make_planner = today
    if forced:
        from ab_variants import force_depth

        force_depth(engine, int(forced), f"{policy}/d{forced}")
    return engine


def host_ms(engine) -> list[float] | None:
    """Per-step host milliseconds from the engine's step records, if it keeps them."""
    records = getattr(engine, "step_records", None)
    if records is None:
        return None
    return [r.host_ms for r in records()]


def timed_window(engine, *, concurrency: int, warmup: int, steps: int, max_tokens: int,
                 tag: str, churn: tuple[int, int] | None = None) -> dict:
    """churn: (lo, hi) - each request ends after lo-hi tokens (seeded by `tag`) and a new one
    takes its place; None: every request decodes through the window (max_tokens)."""
    from lightspec_jax import SamplingParams

    allowances = random.Random(tag)
    live, added = set(), 0

    def add() -> None:
        nonlocal added
        i, added = added, added + 1
        allowance = max_tokens if churn is None else allowances.randint(*churn)
        rid = f"{tag}-{i}"
        engine.add_request(rid, [1 + (i + j) % 500 for j in range(8)],
                           SamplingParams(max_tokens=allowance, ignore_eos=True, seed=0))
        live.add(rid)

    def step() -> list:
        outputs = engine.step()
        for o in outputs:
            if o.finished and o.request_id in live:
                live.discard(o.request_id)
                add()
        return outputs

    for _ in range(concurrency):
        add()
    # Every prompt prefilled (each request has produced a token), then `warmup` more steps:
    # the timed window is decode steps only, whatever an engine's prefill budget rule.
    started = set()
    while len(started) < concurrency:
        started.update(o.request_id for o in step() if o.new_token_ids)
    for _ in range(warmup if churn is None else max(warmup, churn[1])):
        step()
    before = host_ms(engine)
    tokens = 0
    start = time.perf_counter()
    for _ in range(steps):
        tokens += sum(len(o.new_token_ids) for o in step())
    wall = time.perf_counter() - start
    after = host_ms(engine)
    for rid in live:
        engine.abort(rid)
    while engine.has_unfinished_requests():
        engine.step()
    host = None
    if before is not None and after is not None:
        window = after[-steps:] if len(after) >= steps else after
        host = statistics.median(window)
    return {"ms_per_step": 1e3 * wall / steps, "tokens_per_step": tokens / steps,
            "host_ms_per_step": host}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--churn", type=int, nargs=2, default=None, metavar=("LO", "HI"),
                    help="requests end after LO-HI tokens and are replaced (default: none end)")
    ap.add_argument("--label", default="", help="tag stored with the results (e.g. before/after)")
    ap.add_argument("--out", default=None, help="JSON file for the results")
    args = ap.parse_args()

    # Room for every window: each timed step commits at most K+1 tokens.
    max_tokens = 1024  # room for any prefill phase plus the window, K+1 tokens a step
    rows = []
    for c in args.concurrency:
        engines = {}
        for policy in args.policies:
            start = time.perf_counter()
            engines[policy] = build_engine(policy, c, max_model_len=max_tokens + 16)
            print(f"c={c} {policy}: engine built in {time.perf_counter() - start:.1f} s",
                  flush=True)
        samples = {p: [] for p in args.policies}
        for rep in range(args.repeats):
            for policy in args.policies:  # interleaved: machine noise hits every policy alike
                samples[policy].append(timed_window(
                    engines[policy], concurrency=c, warmup=args.warmup, steps=args.steps,
                    max_tokens=max_tokens, tag=f"r{rep}", churn=args.churn))
        plain = statistics.median(s["ms_per_step"] for s in samples.get("none", [])) \
            if "none" in samples else None
        for policy in args.policies:
            ms = statistics.median(s["ms_per_step"] for s in samples[policy])
            hosts = [s["host_ms_per_step"] for s in samples[policy]
                     if s["host_ms_per_step"] is not None]
            row = {"concurrency": c, "policy": policy, "ms_per_step": ms,
                   "ms_per_step_all": [s["ms_per_step"] for s in samples[policy]],
                   "x_plain": ms / plain if plain else None,
                   "host_ms_per_step": statistics.median(hosts) if hosts else None,
                   "tokens_per_step": statistics.median(s["tokens_per_step"]
                                                        for s in samples[policy])}
            rows.append(row)
            host = "-" if row["host_ms_per_step"] is None else f"{row['host_ms_per_step']:.2f}"
            ratio = "-" if row["x_plain"] is None else f"{row['x_plain']:.2f}x"
            print(f"c={c:<4} {policy:<10} {ms:8.2f} ms/step  {ratio:>6} plain  host {host} ms  "
                  f"{row['tokens_per_step']:.1f} tok/step", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"label": args.label, "shape": SHAPE, "args": vars(args), "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
