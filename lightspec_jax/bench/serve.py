"""`lightspec-bench serve`: output tokens per second of each decoding policy at each
concurrency, on one prompt workload, through the public Engine API only.

Timing is made robust against a shared, noisy machine: every (concurrency, policy) engine is
built and warmed once and kept; then each repeat times every policy on the same prompts, in a
rotated order (repeat r starts at policy r), so slow phases of the machine spread over the
policies instead of landing on one. Rows report the median with its min-max.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time

from .policies import parse_policy, policy_name
from .report import spread


def auto_num_prompts(concurrency: int) -> int:
    """Prompts per concurrency level when --num-prompts is not given: two full batches (the
    queue refills as requests finish, so the batch stays full most of the run), and at least
    48 so that c = 1 times several seconds of work per repeat: with 16 (about 2 s a repeat)
    the main job's speculative policies at c = 1, 2-8% apart, ranked differently run to run."""
    return max(48, 2 * concurrency)


def build_engine(args, *, policy: str, depth: int, concurrency: int, max_model_len: int,
                 longest_prompt: int, synthetic: str | None = None,
                 verification: str = "exact", drafter: str | None = None,
                 ngram_shared: bool | None = None, **config):
    """One engine for a (policy, depth) cell; `drafter` defaults to args.drafter (a
    directory or "ngram"); its prefill rows are prefill_buckets() unless `config` names
    `row_buckets`. ngram_shared: SpeculativeConfig.ngram_shared."""
    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
    from lightspec_jax.engine.buckets import concurrency_buckets

    drafter = drafter or (args.drafter[0] if isinstance(args.drafter, list) else args.drafter)
    ngram = drafter == "ngram"
    spec = (SpeculativeConfig() if policy == "none" else
            SpeculativeConfig(policy=policy, num_speculative_tokens=depth,
                              method="ngram" if ngram else None,
                              verification="exact" if verification == "coupled" else
                              verification, coupled_drafts=verification == "coupled",
                              ngram_shared=ngram_shared))
    rows = config.pop("row_buckets", None) or prefill_buckets(concurrency, longest_prompt)
    config = EngineConfig(max_num_seqs=concurrency, max_model_len=max_model_len,
                          dtype=args.dtype, speculative=spec,
                          max_num_batched_tokens=rows[-1], row_buckets=rows,
                          # Buckets from one row per request up to full width: the concurrency
                          # is known, so smaller buckets would never be used.
                          verify_buckets=concurrency_buckets(concurrency, depth) if depth else None,
                          synthetic_acceptance=synthetic if depth else None,
                          show_progress=True, **config)
    return Engine.from_pretrained(args.target, None if policy == "none" or ngram
                                  else drafter, config=config)


def drafter_tags(drafters: list[str]) -> dict[str, str]:
    """A short name per drafter for labels: its kind (eagle3, draft_lm, dflash, dspark,
    ngram), or its directory's name where two share a kind."""
    from lightspec_jax.checkpoint import drafter_kind

    kinds = {d: "ngram" if d == "ngram" else drafter_kind(d) for d in drafters}
    clash = {k for k in kinds.values() if list(kinds.values()).count(k) > 1}
    return {d: os.path.basename(os.path.normpath(d)) if k in clash else k
            for d, k in kinds.items()}


def resolved_dtype(dtype: str) -> str:
    """What "auto" means on this machine (float32 on a CPU), as the engine resolves it."""
    from lightspec_jax import EngineConfig

    return EngineConfig(dtype=dtype).resolved_dtype


def prefill_buckets(concurrency: int, longest_prompt: int) -> tuple[int, ...]:
    """Rows per prefill step: powers of two from 32 (less for short prompts) and their
    midpoints up to a wave of prompts (at most 256 rows, never below the concurrency, enough
    for the longest prompt when that fits). Every bucket is compiled at start-up, so this is
    fewer than the engine's default (from 8 rows); one bucket per wave instead would make a
    27-token prompt pay for 256 rows (ShareGPT at c=1: 18% of static K=3's throughput, 6% of
    plain decoding's), and powers of two alone about 2% (engine/buckets.midpoint_buckets)."""
    from lightspec_jax.engine.buckets import midpoint_buckets  # imports jax: not at CLI start

    def pow2(n: int) -> int:
        return 1 << (max(8, n) - 1).bit_length()

    top = max(concurrency, min(256, pow2(concurrency * longest_prompt)))
    return midpoint_buckets(top, start=min(32, pow2(longest_prompt), top))


def serve(args) -> dict:
    from lightspec_jax.tokenizer import Tokenizer

    from .workloads import load_workload, workload_requests

    tokenizer = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    # args.policies are resolved names ("static:3", "dynamic:7"); depth 0 = plain decoding.
    # Each speculative policy once per verification mode (plain decoding verifies nothing).
    verifications = getattr(args, "verification", None) or ["exact"]
    # ... and once per batch-invariance setting ("<label> inv": EngineConfig.batch_invariant).
    invariances = [mode == "on" for mode in getattr(args, "batch_invariant", None) or ["off"]]
    # ... and once per drafter ("<label> @<drafter>" when there are several).
    drafters = args.drafter if isinstance(args.drafter, list) else [args.drafter]
    tags = drafter_tags(drafters)
    policies = [(name, k or 0, v, inv, d) for inv in invariances
                for name, k in map(parse_policy, args.policies)
                for v in (verifications if k else ["exact"])
                for d in (drafters if k else drafters[:1])]
    print("lightspec-bench serve: one engine per (concurrency, policy); compiled buckets and "
          "measured costs are cached on disk, so the first run takes longest", flush=True)
    rows = []
    for c in args.concurrency:
        n = args.num_prompts or auto_num_prompts(c)
        items = load_workload(args.workload, tokenizer, n, seed=args.seed,
                              max_prompt_len=args.max_prompt_len)
        prompts, params = workload_requests(items, max_tokens=args.max_tokens,
                                            temperature=args.temperature,
                                            ignore_eos=args.ignore_eos)
        engines = {}
        # One group of engines alive at a time (engine_groups), each served side by side with
        # plain decoding, kept across groups (its row spans all of its runs): on a CPU each
        # engine holds ~1,100 JIT-compiled kernels at 3 memory maps apiece, and a process may
        # hold 65,530 maps (Linux's default vm.max_map_count) - about 20 engines.
        groups = engine_groups(policies, drafters)
        for g, group in enumerate(groups):
            built = _build_group(args, engines, group, tags, c, prompts, params)
            labels = [label for label, m in engines.items()
                      if label in built or not m.speculative]
            print(f"[c={c}] serving {len(prompts)} prompts with each policy, {args.repeats} "
                  "times, in rotated order", flush=True)
            for rep in range(args.repeats):
                order = labels[rep % len(labels):] + labels[:rep % len(labels)]
                for label in order:
                    engines[label].run(prompts, params, round_=g * args.repeats + rep)
                print(f"[c={c}] serving, repeat {rep + 1}/{args.repeats}: " + ", ".join(
                    f"{label} {engines[label].tok_s[-1]:.0f}" for label in order) + " tok/s",
                    flush=True)
            for label in built:
                if engines[label].speculative:
                    engines[label].release()
            gc.collect()
        for label, m in engines.items():
            row = m.row(concurrency=c, policy=label, requests=len(prompts))
            # against plain decoding in the same batch-invariance setting
            plain = engines.get("none inv" if label.endswith(" inv") else "none")
            if plain is not None and plain is not m and not args.synthetic \
                    and args.temperature == 0:
                row["identical_to_none"] = m.token_ids == plain.token_ids
            rows.append(row)
        # Free this concurrency's engines before building the next ones (the map limit above):
        # they do not leave promptly without a collection.
        del engines, plain
        gc.collect()
    return {"command": "serve", "rows": rows, "dtype": resolved_dtype(args.dtype),
            "prompts_per_concurrency": {r["concurrency"]: r["requests"] for r in rows}}


# Speculative engines alive at once (plus plain decoding): 8 dynamic engines at c = 16 held
# ~36,000 of the 65,530 memory maps a process may hold.
GROUP_ENGINES = 8


def engine_groups(policies: list[tuple], drafters: list[str]) -> list[list[tuple]]:
    """The serve run's engines in groups: plain decoding (depth 0) in every group, then each
    drafter's speculative policies, at most GROUP_ENGINES per group, in the given order.
    policies: (name, depth, verification, invariant, drafter) tuples."""
    plain = [p for p in policies if not p[1]]
    groups = []
    for d in drafters:
        mine = [p for p in policies if p[1] and p[4] == d]
        groups += [plain + mine[i:i + GROUP_ENGINES]
                   for i in range(0, len(mine), GROUP_ENGINES)]
    return groups or [plain]


def _build_group(args, engines: dict, group, tags, c: int, prompts, params) -> list[str]:
    """Builds and warms one engine per (policy, verification, invariance, drafter) in group
    that `engines` lacks; returns the labels built."""
    longest = max(len(p) for p in prompts)
    built = []
    for name, depth, verification, invariant, drafter in group:
        label = policy_name(name, depth or None) + {
            "exact": "", "probabilistic": " prob", "coupled": " coupled"}[verification] + (
            " inv" if invariant else "") + (f" @{tags[drafter]}" if depth and len(tags) > 1
                                            else "")
        if label in engines:
            continue
        what = "compiling its buckets" + (", timing them for the planner" if depth else "")
        print(f"[c={c}] building engine {label}: {what}", flush=True)
        start = time.perf_counter()
        engine = build_engine(args, policy=name, depth=depth, concurrency=c,
                              max_model_len=longest + args.max_tokens + 1,
                              longest_prompt=longest, synthetic=args.synthetic,
                              verification=verification, batch_invariant=invariant,
                              drafter=drafter,
                              # the timed runs time serving, not first-use compiles
                              precompile_sampling="temperature" if args.temperature > 0
                              else "none")
        startup = time.perf_counter() - start
        # A short full-batch run: each executable's first call (allocation, thread pools)
        # stays out of the timing.
        warm = min(c, len(prompts))
        engine.generate(prompts[:warm], [dataclasses.replace(p, max_tokens=min(
            p.max_tokens, 4)) for p in params[:warm]])
        engines[label] = _Measured(engine=engine, startup_s=startup, speculative=bool(depth),
                                   drafter=tags[drafter] if depth and len(tags) > 1 else None)
        print(f"[c={c}] {label} ready in {startup:.1f} s", flush=True)
        built.append(label)
    return built


class _Measured:
    """One kept engine and what its timed runs measured."""

    def __init__(self, *, engine, startup_s: float, speculative: bool, drafter: str | None):
        self.engine, self.startup_s, self.speculative = engine, startup_s, speculative
        self.drafter = drafter
        self.tok_s: list[float] = []
        self.wall_s: list[float] = []
        self.rounds: list[int] = []
        self.token_ids = None
        self.counters = {"steps": 0, "verified": 0, "accepted": 0}
        self.spec_steps = self.rows = self.depth = 0.0

    def run(self, prompts, params, round_: int) -> None:
        """One timed run; runs of one round are back to back (report._distinct pairs them)."""
        self.rounds.append(round_)
        before = self._stats()
        start = time.perf_counter()
        outs = self.engine.generate(prompts, params)
        wall = time.perf_counter() - start
        after = self._stats()
        self.wall_s.append(wall)
        self.tok_s.append(sum(len(o.token_ids) for o in outs) / wall)
        self.token_ids = self.token_ids or [o.token_ids for o in outs]
        for o in outs:
            if o.metrics is not None:
                for key in self.counters:
                    self.counters[key] += getattr(o.metrics, key)
        if after:
            # summary() covers the engine's whole life (warm-up included); the difference of
            # its running totals isolates the timed runs.
            steps = after["spec_steps"] - before["spec_steps"]
            self.spec_steps += steps
            self.rows += (after["verify_rows_per_step"] * after["spec_steps"]
                          - before["verify_rows_per_step"] * before["spec_steps"])
            self.depth += (after["mean_draft_depth"] * after["spec_steps"]
                           - before["mean_draft_depth"] * before["spec_steps"])

    def release(self) -> None:
        """Drops the engine (its compiled executables go at the next collection); what its
        runs measured stays."""
        self.engine = None

    def _stats(self) -> dict | None:
        stats = self.engine.stats
        return stats.summary() if stats is not None and self.speculative else None

    def row(self, **key) -> dict:
        s = spread(self.tok_s)
        row = {**key, **({"drafter": self.drafter} if self.drafter else {}),
               "tok_s": s["median"], "tok_s_min": s["min"], "tok_s_max": s["max"],
               "tok_s_repeats": s["values"], "repeat_rounds": self.rounds,
               "wall_s_repeats": self.wall_s,
               "startup_s": self.startup_s}
        if self.spec_steps:
            t = self.counters
            row.update(acceptance_rate=t["accepted"] / max(t["verified"], 1),
                       acceptance_length=1 + t["accepted"] / max(t["steps"], 1),
                       verify_rows_per_step=self.rows / self.spec_steps,
                       mean_depth=self.depth / self.spec_steps,
                       ms_per_step=1e3 * sum(self.wall_s) / self.spec_steps)
        return row
