"""Why does the dynamic (LightSpec) policy do what it does? Step-level diagnostics on a real pair.

Runs the dynamic policy (and, for throughput, static K) on a model pair with real exact-match
acceptance, greedy, and reports, per concurrency:

* the plans: chosen draft depth d, fill rows u, bucket B, probes, reasons, predicted vs actual
  tokens per step, and whether the depth the engine drafted is the depth the planner planned;
* counterfactual fills of the SAME proposals. Greedy output is lossless, so the final output of
  a request tells how many drafts of each verified proposal the target would have accepted had
  all of them been verified (A_full). From that: what the actual fill accepted, what a static
  K=3 fill (every request, 3 drafts) would have accepted, what the survival-ranked fill
  (`planner/fill.py`, the device's rule) would accept with K=3's row budget, and
  the oracle (rows spent only on drafts that will be accepted);
* calibration of the drafter's confidences: P(draft j accepted | prefix accepted) against the
  conditional confidence c_j, and P(prefix of j accepted) against the survival prod c_1..c_j;
* the planner's acceptance statistics (survival curve vs the measured one; how many progress
  keys are used on less than `sample_floor` requests of evidence) and the cost tables: the
  start-up sweep against the tables after serving (online refresh);
* from the timed runs (plain `engine.generate`, nothing synced): throughput, the loop period
  per step against the planner's predicted step time, per (B, d); the loop time per kind of
  step; the engine's and the planner's host time per step; and the share of committed tokens
  that passed a request's end (max_tokens), which deep drafting wastes.

Everything is observed through the engine's public hooks: a step observer
(`Engine.add_step_observer`, one `StepEvent` per step read back) for plans, per-slot results
and timings, and the device slot state (`engine.runner.state`) for the proposals. The
acceptance part reads that state after every step, which syncs the host, so it runs on its own
engine with `overlap=False` (each step() dispatches and reads the same step, so the state it
leaves is the proposal the next step verifies), after the timed ones. Engines here skip the
cost cache, so "start-up" tables are this run's own sweep.

What the engine no longer exposes, and so is not reported:
* the planner's plan() and observe() host times separately: `StepRecord.plan_ms` gives their
  sum per step() call, reported as one figure;
* the drafter's commit forward as its own cost: the decode step is one fused executable, so
  the target table (verify) includes it and the draft table holds 1 us placeholders;
* the instrumented run's online cost refresh: without overlap the device idles between steps,
  which gives the refresh no samples, so its tables stay at the start-up sweep (the timed
  dynamic run's refreshed tables are printed with --show-tables).

    python benchmarks/diagnose_dynamic.py --workload math --concurrency 1 16 --num-prompts 16
    python benchmarks/diagnose_dynamic.py --workload sharegpt --concurrency 16 --no-timing
    python benchmarks/diagnose_dynamic.py --concurrency 16 --num-prompts 48 --no-instrument \
        --show-tables --timing-policies static:3 dynamic 'dynamic{"refresh_costs": false}'
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import numpy as np

# The instrumented (acceptance) run and its report: benchmarks/, the script's own folder.
from diagnose_acceptance import (analyse, cost_tables, measured_survival, print_cost_table,
                                 print_report, run_instrumented)

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "lightspec_jax", "assets", "tiny-pair")


def make_engine(args, *, policy: str, depth: int, concurrency: int, max_model_len: int,
                planner_options: dict | None = None, overlap: bool = True):
    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
    from lightspec_jax.engine.buckets import concurrency_buckets

    spec = SpeculativeConfig(policy=policy, num_speculative_tokens=depth)
    config = EngineConfig(max_num_seqs=concurrency, max_model_len=max_model_len,
                          dtype="float32", speculative=spec,
                          max_num_batched_tokens=max(256, concurrency),
                          verify_buckets=concurrency_buckets(concurrency, depth),
                          overlap=overlap, cost_cache_dir=None, show_progress=False)
    drafter = None if policy == "none" else args.drafter
    engine = Engine.from_pretrained(args.target, drafter, config=config)
    if planner_options and policy == "dynamic":
        _replace_planner(engine, planner_options)
    return engine


def _replace_planner(engine, options: dict) -> None:
    from lightspec_jax.planner import make_planner

    old = engine.planner
    engine.planner = make_planner("dynamic", old.spec, target_costs=old.target_costs,
                                  draft_costs=old.draft_costs, depth_costs=old.depth_costs,
                                  **options)


class Clock:
    """Step observer of a timed run; syncs nothing. The period between consecutive reads (the
    real cost of a step in throughput terms), by kind of step, and the host time per step."""

    def __init__(self, engine):
        self.records = []  # every StepRecord of the run
        self.rows = []  # (plan, period ms) of decode steps
        self.split = collections.defaultdict(lambda: [0.0, 0, 0])  # kind -> ms, steps, tokens
        self._last = None
        engine.add_step_observer(self._on_step)

    def _on_step(self, event) -> None:
        now = time.perf_counter()
        record, plan = event.record, event.plan
        self.records.append(record)
        if self._last is not None:
            ms = 1e3 * (now - self._last)
            if plan is None:
                kind = "prefill only"
            else:
                self.rows.append((plan, ms))
                kind = ("with prefill" if record.prefill_rows > 0 else
                        "no proposal yet" if plan.num_with_proposal < plan.num_requests
                        else "decode only")
            cell = self.split[kind]
            cell[0] += ms
            cell[1] += 1
            cell[2] += record.emitted
        self._last = now

    def split_report(self) -> str:
        records = self.records
        planned = max(sum(r.verify_rows > 0 for r in records), 1)
        host = sum(r.host_ms for r in records) / max(len(records), 1)
        wait = sum(r.wait_ms for r in records) / max(len(records), 1)
        plan = sum(r.plan_ms for r in records) / planned
        return ("  loop time by step kind: " + "; ".join(
            f"{k}: {ms:.0f} ms, {n} steps, {tok} tokens ({ms / max(tok, 1):.2f} ms/token)"
            for k, (ms, n, tok) in sorted(self.split.items()))
            + f"\n  host ms per step {host:.3f} (blocked on the device {wait:.3f} more); "
            f"planner plan()+observe() ms per decode step {plan:.3f}")

    def report(self) -> str:
        rows = [(p, ms) for p, ms in self.rows if np.isfinite(p.predicted_ms)]
        if not rows:
            return "  (no planned steps)"
        period = np.array([ms for _, ms in rows])
        pred = np.array([p.predicted_ms for p, _ in rows])
        by_config = collections.defaultdict(list)
        for p, ms in rows:
            by_config[(p.verify_rows, p.draft_depth)].append((ms, p.predicted_ms))
        lines = [f"  loop period per planned step {np.median(period):.2f} ms (median) vs the "
                 f"planner's predicted {np.median(pred):.2f} ms: unmodelled "
                 f"{np.median(period - pred):.2f} ms (median), {np.mean(period - pred):.2f} "
                 "(mean; steps that follow a prefill carry it)"]
        for (b, d), v in sorted(by_config.items()):
            if len(v) >= 3:
                lines.append(f"    B={b:<4} d={d:<2} n={len(v):<4} period "
                             f"{np.median([x for x, _ in v]):6.2f}  predicted "
                             f"{np.median([y for _, y in v]):6.2f}")
        return "\n".join(lines)


def run(args) -> int:
    from lightspec_jax.bench.workloads import load_workload, workload_requests
    from lightspec_jax.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    items = load_workload(args.workload, tokenizer, args.num_prompts, seed=args.seed,
                          max_prompt_len=args.max_prompt_len)
    prompts, params = workload_requests(items, max_tokens=args.max_tokens)
    max_len = max(len(p) for p in prompts) + args.max_tokens + 1
    options = json.loads(args.planner_options) if args.planner_options else None
    for c in args.concurrency:
        if not args.no_timing:
            for policy in args.timing_policies:
                spec, _, extra = policy.partition("{")
                name, _, k = spec.partition(":")
                depth = int(k) if k else args.max_depth
                opts = json.loads("{" + extra) if extra else options
                engine = make_engine(args, policy=name, depth=depth, concurrency=c,
                                     max_model_len=max_len, planner_options=opts)
                planner = engine.planner
                startup = cost_tables(planner)
                engine.generate(prompts[:c], params[:c])  # warm-up
                clock = Clock(engine)
                start = time.perf_counter()
                outs = engine.generate(prompts, params)
                wall = time.perf_counter() - start
                tokens = sum(len(o.token_ids) for o in outs)
                st = [r for r in clock.records if r.verify_rows > 0]
                m = [o.metrics for o in outs if o.metrics is not None]
                acc_len = 1 + sum(x.accepted for x in m) / max(sum(x.steps for x in m), 1)
                committed = sum(x.accepted + x.num_requests for x in st)
                emitted = sum(x.emitted for x in st)
                print(f"c={c:<3} {policy:<10} {tokens / wall:8.1f} tok/s  acc.len {acc_len:.2f}"
                      f"  steps {len(st)}  ms/step {1e3 * wall / max(len(st), 1):.2f}  "
                      f"rows/step {np.mean([s.verify_rows for s in st]):.1f}  "
                      f"d {np.mean([s.draft_depth for s in st]):.1f}  emitted/committed "
                      f"{emitted / max(committed, 1):.2f} (the rest passed a request's end)",
                      flush=True)
                print(clock.split_report(), flush=True)
                if name == "dynamic":
                    print(clock.report(), flush=True)
                    if args.show_tables:
                        after = cost_tables(planner)
                        for k in after:
                            print(f"  {k} table, start-up -> after serving (samples):")
                            print_cost_table(startup[k], after[k])
        if args.no_instrument:
            continue
        engine = make_engine(args, policy="dynamic", depth=args.max_depth, concurrency=c,
                             max_model_len=max_len, planner_options=options, overlap=False)
        planner = engine.planner
        startup = cost_tables(planner)
        engine.generate(prompts[:c], params[:c])  # warm-up: statistics start here as in serving
        rec, outputs = run_instrumented(engine, prompts, params)
        analysis = analyse(rec, outputs)
        print_report(f"{args.workload} c={c} dynamic K<={args.max_depth} (instrumented)",
                     analysis, planner, startup, measured_survival(rec, outputs, args.max_depth),
                     engine.cost_profile)
        if args.dump:
            with open(f"{args.dump}-c{c}.json", "w") as f:
                json.dump(analysis["rows"], f)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=os.path.join(ASSETS, "target"))
    p.add_argument("--drafter", default=os.path.join(ASSETS, "drafter"))
    p.add_argument("--workload", default="math", choices=("sharegpt", "humaneval", "math"))
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-prompt-len", type=int, default=256)
    p.add_argument("--max-depth", type=int, default=11)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timing-policies", nargs="+", default=["static:3", "dynamic"],
                   help='static:K, dynamic[:K], or dynamic with its own planner options, '
                   'e.g. \'dynamic{"refresh_costs": false}\'')
    p.add_argument("--no-timing", action="store_true", help="skip the timed runs")
    p.add_argument("--show-tables", action="store_true",
                   help="print the cost tables after each timed dynamic run")
    p.add_argument("--no-instrument", action="store_true",
                   help="skip the instrumented (acceptance) run")
    p.add_argument("--planner-options", help='JSON LightSpecOptions overrides, e.g. '
                   '\'{"refresh_costs": false}\'')
    p.add_argument("--dump", help="write per-step rows to DUMP-c<C>.json")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
