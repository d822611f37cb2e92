"""Planner variants side by side: several engines in one process, the same prompts, interleaved.

`lightspec-bench serve` compares policies; this compares *how* a policy plans. Each variant is a
policy with planner options (any `LightSpecOptions` field) and, for diagnosis, a forced next
draft depth. Every variant is built and warmed first; then each repeat serves the prompts on
every variant in a rotated order, so a slow phase of this shared machine spreads over them all.
Outputs must agree token for token across variants (greedy): the script exits 1 otherwise.

    python benchmarks/policy_ab.py --workload sharegpt --concurrency 16 --repeats 3 \\
        static:2 free=dynamic:7 nocal=dynamic:7,calibrate=false d2=dynamic:7,force_depth=2

A variant is [label=]policy[,option=value...]; option values parse as Python literals (true,
false and none also work). `force_depth=D` makes the dynamic planner draft D after every step
and turns its probes off (what the free choice costs against a fixed depth in the same engine).
`catch_up=false` makes a drafter that catches up (the draft LM, `--drafter`) commit at every
step instead, floor steps included (what the floor's catch-up saves). `floor_timed=N` makes one
floor step in N a timing sample for the planner (engine.planning.FLOOR_TIMED; 1: every one).
`admission_interval=N` (any policy) builds the variant's engine with
`EngineConfig(admission_interval=N)`: it admits waiting requests at most once every N steps
while others decode (what gathering admissions into fewer prompt steps is worth).
`prefill=pow2` (any policy) compiles the variant's prompt chunks at powers of two alone, the
benchmark's rule before the midpoints (bench/serve.prefill_buckets) were added.
`ngram_shared=false` (any policy, with `--drafter ngram`) keeps the n-gram drafter's lookup to
each request's own tokens (`SpeculativeConfig.ngram_shared`; on by default).
`replay_plans=true` lets the variant's planner decide one untimed pass over the prompts, then
serves every timed repeat with those plans replayed, the planner idle (no plan() or observe()
work): what the planner's host time costs the loop, its decisions held fixed. Greedy serving
is deterministic, so each replayed plan meets the batch it was made for; the script checks
that (requests and their allowances) and exits 1 if one does not. With `planner_busy=true`
as well, the live planner still plans every step and learns from every read-back, its plans
thrown away: beside a plain replay, the same decisions with and without the planner's work.
`plans_from=LABEL` (with replay_plans) serves the plans an earlier variant's pass recorded
instead of the variant's own: variants that replay one pass run the very same steps, so
`busy=...,planner_busy=true,plans_from=idle` beside `idle=dynamic:7,replay_plans=true` - or
two planners' versions busy on one list - differ in the planner's host work alone.
`cost_table=PATH` starts the variant's engine from a copy of the cost tables in PATH (a file
the engine's cost cache or `cost_table_path` wrote), and `cost_table=sweep` from a fresh
start-up sweep; without it a variant loads the engine's cost cache like any engine. The copy
takes the variant's online refresh, so PATH is left as it was. Two variants, one on a table
refreshed over many runs and one on a fresh sweep, show what the table's history costs:

    python benchmarks/policy_ab.py --workload math --concurrency 1 --num-prompts 48 \
        --repeats 10 static:3 old=dynamic:7,cost_table=OLD.json fresh=dynamic:7,cost_table=sweep

A variant whose planner is not the engine's own (planner options, `planner_at`, `force_depth`,
`catch_up=false`, `floor_timed`) and names no `cost_table` starts from the engine's cost cache
but writes its refreshed tables to a temporary copy: the cache that default engines load stays
refreshed by the default planner alone (a variant of an older planner, or one with
`refresh_cells=true`, would otherwise refresh the shared tables cell by cell, the drift the
forty-third session's column refresh ended).

`planner_at=REV` builds the variant's planner from the planner package at git revision REV
(planner_replay.planner_at), so a planner change runs against its predecessor in one process:

    python benchmarks/policy_ab.py --workload math --concurrency 64 --num-prompts 256 \
        old=dynamic:7,planner_at=HEAD new=dynamic:7

Per variant it prints throughput (mean, per repeat, against the first variant, the range and
median of its ratio to the first variant repeat by repeat - the two ran minutes apart at most -
and a 95% interval of the ratio of means from the repeats resampled in pairs), the host and
planner ms per decode step, the draft depths chosen, and where the wall time went by kind of
step - `prefill` (the step also ran a prompt chunk), `full` (decode only, at least 3/4 of the
concurrency decoding), `tail` (decode only, fewer) - with tokens per ms in each, and the share
of decode steps that verified fewer rows than their proposal's full width (`trimmed`). With
`--periods` it also fits, per kind of step, the loop's period between read-backs against the
prompt rows, verify rows and draft rows in it (least squares): what a verify row costs the loop
beside a prompt chunk and without one; and the full decode steps' periods by the plan that ran
them (the depth drafted before, verified, drafted), "floor" for steps inside a run at the
floor - what a floor step costs a dynamic engine beside a forced floor's or plain decoding's.
With `--by-size`, the decode steps by how many requests they decoded
(step_kinds.by_batch_size): where a wave is admitted or drains, at what price a token. With
three variants or more, each one's ratio to the best of the others in the run (the bar a
dynamic policy is held to), with the same interval. Last, where two or more variants
run one policy (planner variants, say), their full decode steps priced at common prices
(step_kinds.common_prices): each step at the median period of its cell over all of them and
every repeat, so that what they chose is compared without the machine's speed at the times
each ran. Only variants of one policy share prices (and replayed plans served idle form their
own group): a static policy's planner costs a step less host time than the dynamic one's, in
the same cell. Two identical dynamic engines read 0.99-1.02x apart
this way at c = 1 and 4, where measured they ran 0.93-1.05x apart; at c = 16 most steps carry
a prompt chunk and few are priced (BENCHMARKS.md, fifty-second session).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import types

import numpy as np

# benchmarks/: the script's own folder
from ab_variants import build, keep_tables_apart, parse_variant  # noqa: F401
from paired_ratios import over_best, ratio_interval
from replayed_plans import ReplayedPlans, replay_plans  # noqa: F401
from step_kinds import by_batch_size, common_prices, period_fit, plan_periods, summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", type=parse_variant,
                        help="[label=]policy[,option=value...]; the first is the reference")
    parser.add_argument("--workload", default="sharegpt")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="prompts per repeat (default: max(24, 4 x concurrency))")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--periods", action="store_true",
                        help="fit each variant's step periods by kind of step")
    parser.add_argument("--by-size", action="store_true",
                        help="break each variant's decode steps down by requests decoded")
    parser.add_argument("--drafter", default=None,
                        help="the drafter's folder (default: the pair's drafter/; e.g. the "
                        "shipped pair's draft-lm/ or dflash/)")
    parser.add_argument("--pair", default=None,
                        help="a pair's folder holding target/ and drafter/ (default: the "
                        "shipped tiny pair)")
    args = parser.parse_args(argv)
    from lightspec_jax.bench.workloads import load_workload, workload_requests
    from lightspec_jax.tokenizer import Tokenizer

    from lightspec_jax.assets import tiny_pair

    c = args.concurrency
    if args.pair is None:
        shipped = tiny_pair()
        target, drafter = shipped.target, shipped.drafter
    else:
        target, drafter = (os.path.join(args.pair, d) for d in ("target", "drafter"))
    drafter = args.drafter or drafter
    model = types.SimpleNamespace(target=target, drafter=drafter, dtype="float32",
                                  max_tokens=args.max_tokens)
    tok = Tokenizer.from_file(os.path.join(target, "tokenizer.json"))
    items = load_workload(args.workload, tok, args.num_prompts or max(24, 4 * c), seed=0,
                          max_prompt_len=256)
    prompts, params = workload_requests(items, max_tokens=args.max_tokens)
    longest = max(map(len, prompts))
    runs = {}
    for v in args.variants:
        if v.label in runs:
            raise SystemExit(f"two variants are labelled {v.label!r}: give one a label=")
        engine = build(v, model, c, longest)
        warm = min(c, len(prompts))
        engine.generate(prompts[:warm], [dataclasses.replace(p, max_tokens=4)
                                         for p in params[:warm]])
        repeats: list[list] = []  # per repeat: (read time, StepRecord, StepPlan) per step
        script = None
        if v.replay_plans:
            source = None
            if v.plans_from is not None:
                if v.plans_from not in runs or runs[v.plans_from][3] is None:
                    raise SystemExit(f"{v.label}: plans_from={v.plans_from} names no earlier "
                                     "variant with replay_plans")
                source = runs[v.plans_from][3].plans
            script = replay_plans(engine, prompts, params, busy=v.planner_busy, plans=source)
        engine.add_step_observer(lambda e, r=repeats: r[-1].append(
            (time.perf_counter(), e.record, e.plan)))
        runs[v.label] = (engine, repeats, [], script)
    labels, outputs = list(runs), {}
    for rep in range(args.repeats):
        for label in labels[rep % len(labels):] + labels[:rep % len(labels)]:
            engine, repeats, tok_s, script = runs[label]
            if script is not None:
                script.rewind()
            repeats.append([])
            start = time.perf_counter()
            out = engine.generate(prompts, params)
            tok_s.append(sum(len(o.token_ids) for o in out) / (time.perf_counter() - start))
            outputs[label] = [o.token_ids for o in out]
    reference = np.mean(runs[labels[0]][2])
    first = np.asarray(runs[labels[0]][2])  # [R] the reference's tok/s per repeat
    print(f"{args.workload}, c={c}, {len(prompts)} prompts, max_tokens {args.max_tokens}, "
          f"{args.repeats} interleaved repeats (tok/s mean, per repeat, x {labels[0]}):")
    for label in labels:
        _, repeats, tok_s, _ = runs[label]
        s = summarize(repeats, c)
        mid, lo, hi = ratio_interval(tok_s, first)
        print(f"{label:>12s} {np.mean(tok_s):8.1f} [{' '.join(f'{x:.0f}' for x in tok_s)}] "
              f"x{np.mean(tok_s) / reference:.3f} (per repeat "
              f"{np.min(tok_s / first):.3f}-{np.max(tok_s / first):.3f}, median {mid:.3f}; "
              f"95% {lo:.3f}-{hi:.3f})  "
              f"host ms/step {s['host_ms']:.2f} (planner "
              f"{s['plan_ms']:.2f})  depths {s['depths']}  trimmed {s['trimmed']:.0%}")
        print(" " * 13 + "  ".join(f"{k}: {n} steps {ms:.0f} ms {t} tok ({t / ms:.2f}/ms)"
                                   for k, (n, ms, t) in sorted(s["kinds"].items()) if ms > 0))
        if args.periods:
            for line in period_fit(repeats) + plan_periods(repeats, c)[:8]:
                print(" " * 13 + line)
        if args.by_size:
            for line in by_batch_size(repeats, c):
                print(" " * 13 + line)
    if len(labels) > 2:
        # The bar a dynamic policy is held to: each variant over the best of the others in
        # this run (by mean tok/s), paired repeat by repeat as above.
        print("each variant over the best other one (x, median, 95% of the ratio of means):")
        for label, (best, ratio, mid, lo, hi) in over_best(
                {label: runs[label][2] for label in labels}).items():
            print(f"{label:>12s} x{ratio:.3f} {best} (median {mid:.3f}; 95% {lo:.3f}-{hi:.3f})")
    # a planner that plans and one replaying plans idle cost a step different host time
    policies = {v.label: (v.policy, "idle" if v.replay_plans and not v.planner_busy else "")
                for v in args.variants}
    for key in dict.fromkeys(policies.values()):
        group = [label for label in labels if policies[label] == key]
        if len(group) < 2:
            continue
        policy = " ".join(key).strip()
        priced = common_prices({label: runs[label][1] for label in group}, c)
        base = priced[group[0]][1] / max(priced[group[0]][2], 1)
        print(f"{policy} variants' full decode steps at their common prices (the median period "
              f"of each verify bucket and depth drafted before, over them all; x {group[0]}):")
        for label in group:
            steps, ms, tokens, own = priced[label]
            if not (tokens and base):
                print(f"{label:>12s} {steps} full decode steps, {tokens} tok: nothing to compare")
                continue
            print(f"{label:>12s} {steps} steps {tokens} tok  {ms / tokens:.3f} ms/tok "
                  f"x{base / (ms / tokens):.3f}  (as measured {own / tokens:.3f} ms/tok)")
    astray = {label: runs[label][3].mismatches for label in labels
              if runs[label][3] is not None and runs[label][3].mismatches}
    if astray:
        print(f"REPLAYED PLANS MET OTHER BATCHES (plans, by variant): {astray}")
        return 1
    differ = [label for label in labels if outputs[label] != outputs[labels[0]]]
    if differ:
        print(f"OUTPUTS DIFFER from {labels[0]}'s: {differ}")
        return 1
    print(f"every variant's output equals {labels[0]}'s, token for token")
    return 0


def main_with(after_build, argv: list[str] | None = None) -> int:
    """main() with after_build(variant, engine) called on each variant's engine once it is
    built, before its warm-up: how a diagnosis wraps the planner it serves with
    (planner_cpu_time.py, the scratch scripts kept with benchmark results)."""
    global build
    plain = build

    def hooked(variant, *args, **kwargs):
        engine = plain(variant, *args, **kwargs)
        after_build(variant, engine)
        return engine

    build = hooked
    try:
        return main(argv)
    finally:
        build = plain


if __name__ == "__main__":
    sys.exit(main())
