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

from lightspec_jax.planner.fill import clamp_confidence, fill_lengths, survival_scores

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


class Recorder:
    """Step observer of the instrumented run: each decode step's proposals and results.

    After every step (overlap=False) it snapshots the device slot state: for each slot still
    active, that is the proposal the next decode step verifies. A slot that decodes without
    having been active at the snapshot completed its prompt in that same step, so it holds no
    proposal; its request is the one admitted into the slot (owner or queued at the snapshot).
    """

    def __init__(self, engine):
        self.engine = engine
        self.steps = []  # dicts, one per decode step
        self._snapshot()
        engine.add_step_observer(self._on_step)

    def _snapshot(self) -> None:
        state, scheduler = self.engine.runner.state, self.engine.scheduler
        self._pre = {k: np.asarray(getattr(state, k)) for k in
                     ("active", "seq_len", "last_token", "draft_tokens", "draft_conf",
                      "proposal_len")}
        self._owner = list(scheduler.owner)
        self._candidates = [r for r in self._owner if r is not None] + list(scheduler.waiting)

    def _on_step(self, event) -> None:
        if event.plan is not None:
            self._record(event)
        self._snapshot()

    def _record(self, event) -> None:
        c, readback, pre = event.columns, event.readback, self._pre
        slots = np.flatnonzero(readback[:, c.emitted] > 0)
        k = pre["draft_tokens"].shape[1]
        requests, seq_len, last, plen = [], [], [], []
        tokens = np.zeros((len(slots), k), np.int64)
        conf = np.zeros((len(slots), k), np.float32)
        for i, s in enumerate(slots.tolist()):
            if pre["active"][s]:
                request = self._owner[s]
                seq_len.append(pre["seq_len"][s])
                last.append(pre["last_token"][s])
                plen.append(pre["proposal_len"][s])
                tokens[i], conf[i] = pre["draft_tokens"][s], pre["draft_conf"][s]
            else:  # prefilled in this step: its first token is last_token, no proposal yet
                request = next(r for r in self._candidates if r.slot == s)
                seq_len.append(request.prompt_len)
                last.append(-1)
                plen.append(0)
            requests.append(request)
        self.steps.append(dict(
            plan=event.plan, requests=requests, slots=slots,
            prompt_len=np.array([r.prompt_len for r in requests]),
            seq_len=np.array(seq_len), last_token=np.array(last), plen=np.array(plen),
            tokens=tokens, conf=conf, accepted=readback[slots, c.accepted],
            verified=readback[slots, c.verified], offered=readback[slots, c.offered]))


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


def full_acceptance(step, outputs: dict) -> np.ndarray:
    """A_full [N]: drafts of each proposal the target accepts if all are verified; -1 where the
    request's output ends before the proposal can be judged (no mismatch within what we saw)."""
    out = np.full(len(step["requests"]), -1)
    for i, request in enumerate(step["requests"]):
        tokens = outputs[request]
        base = int(step["seq_len"][i] - step["prompt_len"][i])  # output index of last_token
        plen = int(step["plen"][i])
        a = 0
        while a < plen:
            k = base + 1 + a
            if k >= len(tokens):
                a = -1
                break
            if tokens[k] != step["tokens"][i, a]:
                break
            a += 1
        out[i] = a
    return out


def snapshot_consistent(step, outputs: dict) -> bool:
    """The snapshot is the proposal the device verified: its length is what the step says the
    proposal offered, and its last_token is the request's output at seq_len."""
    if (step["plen"] != step["offered"]).any():
        return False
    for i, request in enumerate(step["requests"]):
        if step["last_token"][i] >= 0:
            base = int(step["seq_len"][i] - step["prompt_len"][i])
            if outputs[request][base] != step["last_token"][i]:
                return False
    return True


def survival_fill(conf: np.ndarray, plen: np.ndarray, rows: int) -> np.ndarray:
    """Drafts per request the device fill verifies with `rows` rows, target rows included."""
    return fill_lengths(conf, plen, int(rows) - len(plen))


def oracle_fill(a_full: np.ndarray, rows: int) -> float:
    """Tokens committed if `rows` rows went only to drafts that will be accepted."""
    n = len(a_full)
    extra = max(rows - n, 0)
    return n + min(extra, int(a_full.sum()))


def analyse(recorder: Recorder, outputs: dict, k_static: int = 3) -> dict:
    rows = []
    calib = collections.defaultdict(lambda: [0, 0, 0.0])  # bin -> [n, accepted, sum conf]
    surv_calib = collections.defaultdict(lambda: [0, 0, 0.0])
    depth_mismatch = 0
    prev_plan = None
    for step in recorder.steps:
        plan = step["plan"]
        a_full = full_acceptance(step, outputs)
        known = a_full >= 0
        with_prop = step["plen"] > 0
        if prev_plan is not None and with_prop.any():
            depth_mismatch += int((step["plen"][with_prop] != prev_plan.draft_depth).any())
        if (step["plen"][with_prop] != plan.verified_depth).any():
            depth_mismatch += 1
        prev_plan = plan
        acc = step["accepted"]
        # exact-match sanity: what the fill accepted = min(A_full, verified lengths)
        consistent = bool((acc[known] == np.minimum(a_full[known], step["verified"][known])).all())
        n = len(acc)
        af = np.where(known, a_full, step["plen"])  # unknown tails: optimistic
        static_rows = n * (k_static + 1)
        surv_at_static = survival_fill(step["conf"], step["plen"], static_rows)
        rows.append(dict(
            n=n, reason=plan.reason, d_prev=plan.verified_depth, depth=plan.draft_depth,
            fill=plan.fill_rows, bucket=plan.verify_rows, used=int(step["verified"].sum() + n),
            committed=int((acc + 1).sum()), pred_tokens=plan.predicted_tokens,
            pred_ms=plan.predicted_ms, consistent=consistent,
            snapshot_consistent=snapshot_consistent(step, outputs),
            full=int((np.minimum(af, step["plen"]) + 1).sum()),
            static_k=int((np.minimum(af, k_static) + 1).sum()),
            static_k_rows=static_rows,
            surv_at_static=int((np.minimum(af, surv_at_static) + 1).sum()),
            oracle_at_fill=oracle_fill(af, plan.fill_rows),
            same_fill_rows=bool((step["verified"] == survival_fill(
                step["conf"], step["plen"], plan.fill_rows)).all())))
        clamped = clamp_confidence(step["conf"])  # [N, K]
        survival = survival_scores(step["conf"], step["plen"])  # [N, K]
        for i in range(n):
            if a_full[i] < 0:
                continue
            for j in range(int(step["plen"][i])):
                c, s = float(clamped[i, j]), float(survival[i, j])
                ok = a_full[i] > j
                if a_full[i] >= j:  # prefix accepted: conditional sample for position j+1
                    b = min(int(c * 10), 9)
                    calib[b][0] += 1
                    calib[b][1] += int(ok)
                    calib[b][2] += c
                b = min(int(s * 10), 9)
                surv_calib[b][0] += 1
                surv_calib[b][1] += int(ok)
                surv_calib[b][2] += s
    return dict(rows=rows, calib=dict(calib), surv_calib=dict(surv_calib),
                depth_mismatch_steps=depth_mismatch)


def measured_survival(recorder: Recorder, outputs: dict, max_depth: int) -> np.ndarray:
    """P(A_full >= j) over every proposal offering at least j drafts, j = 1..K (NaN: none)."""
    hits, seen = np.zeros(max_depth + 1), np.zeros(max_depth + 1)
    for step in recorder.steps:
        a_full = full_acceptance(step, outputs)
        for i, a in enumerate(a_full):
            if a < 0:
                continue
            for j in range(1, int(step["plen"][i]) + 1):
                seen[j] += 1
                hits[j] += a >= j
    with np.errstate(invalid="ignore"):
        return hits / seen


def print_report(label: str, analysis: dict, planner, startup_table: dict,
                 true_survival: np.ndarray, profile) -> None:
    rows = analysis["rows"]
    planned = [r for r in rows if r["reason"] in ("plan", "probe", "visit")]
    print(f"\n=== {label}: {len(rows)} speculative steps "
          f"({collections.Counter(r['reason'] for r in rows)})")
    if not rows:
        return
    steps = len(rows)
    req_steps = sum(r["n"] for r in rows)
    tot = lambda key: sum(r[key] for r in rows)  # noqa: E731
    print(f"tokens per request-step: actual {tot('committed') / req_steps:.2f} | same proposals, "
          f"all verified {tot('full') / req_steps:.2f} | static K=3 fill "
          f"{tot('static_k') / req_steps:.2f} (a lower bound where the proposal was shallower "
          f"than 3) | survival fill with K=3's rows "
          f"{tot('surv_at_static') / req_steps:.2f} | oracle at the chosen rows "
          f"{tot('oracle_at_fill') / req_steps:.2f}")
    print(f"rows per step: fill u {tot('fill') / steps:.1f}  bucket B {tot('bucket') / steps:.1f}"
          f"  used {tot('used') / steps:.1f}  (K=3 full width {tot('static_k_rows') / steps:.1f})")
    print(f"tokens per verified row: actual {tot('committed') / tot('used'):.3f}  "
          f"K=3 fill {tot('static_k') / tot('static_k_rows'):.3f}")
    print(f"exact-match consistent (accepted == min(A_full, verified)): "
          f"{all(r['consistent'] for r in rows)}; state snapshot == verified proposal: "
          f"{sum(r['snapshot_consistent'] for r in rows)}/{steps}; device fill == reference "
          f"survival fill: {sum(r['same_fill_rows'] for r in rows)}/{steps}; steps whose "
          f"drafted depth != planned depth: {analysis['depth_mismatch_steps']}")
    depths = collections.Counter(r["depth"] for r in rows)
    fills = collections.Counter((r["d_prev"], r["fill"], r["bucket"]) for r in rows)
    print("draft depth chosen:", dict(sorted(depths.items())))
    print("(d_prev, fill u, bucket B) most common:", fills.most_common(8))
    if planned:
        pt = np.array([r["pred_tokens"] for r in planned])
        at = np.array([r["committed"] for r in planned])
        print(f"predicted vs actual tokens per planned step: {pt.mean():.2f} vs {at.mean():.2f}"
              f" (ratio {at.sum() / pt.sum():.3f})")
    print("conditional calibration  conf-bin: n  mean conf  P(accept | prefix)")
    for b in sorted(analysis["calib"]):
        n, ok, s = analysis["calib"][b]
        print(f"  [{b / 10:.1f},{(b + 1) / 10:.1f}): {n:6d}  {s / n:.3f}  {ok / n:.3f}")
    print("survival calibration     surv-bin: n  mean surv  P(prefix accepted)")
    for b in sorted(analysis["surv_calib"]):
        n, ok, s = analysis["surv_calib"][b]
        print(f"  [{b / 10:.1f},{(b + 1) / 10:.1f}): {n:6d}  {s / n:.3f}  {ok / n:.3f}")
    stats = getattr(planner, "stats", None)
    if stats is not None:
        np.set_printoptions(precision=3, suppress=True, linewidth=140)
        print("planner survival[1..K]:", stats.survival[1:])
        print("measured P(A>=j)     :", true_survival[1:])
        # The planner's per-key evidence is internal state (read, never changed).
        keys = stats._progress
        light = {k: e for k, e in keys.items() if e[3] < 1.0}
        gaps = np.array([(e[3], abs(e[0] - float(stats._prior(n, np.array([u]), d, None)[0])))
                         for (n, u, d, *_class), e in keys.items()]).reshape(-1, 2)
        w_light = gaps[:, 0] < 1
        print(f"progress keys: {len(keys)}; with less than one full-weight step of evidence "
              f"(W < 1, i.e. < sample_floor={stats.sample_floor} requests): {len(light)}; "
              f"|EMA - survival fill| mean "
              f"{gaps[:, 1].mean() if len(gaps) else float('nan'):.3f} for W<1 keys "
              f"{gaps[w_light, 1].mean() if w_light.any() else float('nan'):.3f}")
    for name, after in _tables(planner).items():
        print(f"{name} cost table, ms (start-up sweep -> after serving, samples):")
        _print_table(startup_table[name], after)
    if profile is not None:
        print("measured draft stage by depth, ms:",
              {d: round(ms, 2) for d, ms in profile.draft_depth_ms.items()})


def _tables(planner) -> dict:
    """The planner's non-empty cost tables as JSON."""
    out = {}
    for name in ("target", "draft", "depth"):
        table = getattr(planner, f"{name}_costs", None)
        if table is not None and not table.is_empty:
            out[name] = table.to_json()
    return out


def _print_table(before: dict, after: dict) -> None:
    ref = next((c["rows"] for c in before["columns"]
                if c["context_len"] == before["reference_context"]), {})
    for col in after["columns"]:
        cells = ", ".join(
            f"{r}:{ref.get(r, float('nan')):.2f}->{ms:.2f}({col['counts'][r]})"
            for r, ms in col["rows"].items())
        print(f"  context {col['context_len']}: {cells}")


def run_instrumented(engine, prompts, params) -> tuple[Recorder, dict]:
    """Serves the prompts one step() at a time under a Recorder; returns it and each request's
    final output (Request -> token ids)."""
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"diagnose-{i}", prompt, p)
    recorder = Recorder(engine)  # after queueing: the first snapshot sees the queued requests
    while engine.has_unfinished_requests():
        engine.step()
    requests = {r for s in recorder.steps for r in s["requests"]}
    return recorder, {r: list(r.output_token_ids) for r in requests}


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
                startup = _tables(planner)
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
                        after = _tables(planner)
                        for k in after:
                            print(f"  {k} table, start-up -> after serving (samples):")
                            _print_table(startup[k], after[k])
        if args.no_instrument:
            continue
        engine = make_engine(args, policy="dynamic", depth=args.max_depth, concurrency=c,
                             max_model_len=max_len, planner_options=options, overlap=False)
        planner = engine.planner
        startup = _tables(planner)
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
