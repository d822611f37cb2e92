"""The instrumented (acceptance) run of benchmarks/diagnose_dynamic.py and its report.

`run_instrumented` serves the prompts one step() at a time under a `Recorder` (a step observer
that snapshots the device slot state after every step: the proposal the next step verifies);
`analyse` replays each recorded step against what the target would have accepted of the same
proposals (A_full, read off the requests' final greedy output): the actual fill, static K=3,
the survival-ranked fill at K=3's rows, the oracle, and the drafter's confidence calibration;
`measured_survival` is the measured survival curve; `print_report` prints all of it with the
planner's acceptance statistics and its cost tables (`cost_tables`, `print_cost_table`, which
the timed runs use too).

The timed runs and the command line stay in diagnose_dynamic.py (its docstring says what is
reported and why), which imports this module from its own folder, benchmarks/.
"""

from __future__ import annotations

import collections

import numpy as np

from lightspec_jax.planner.fill import clamp_confidence, fill_lengths, survival_scores


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
    for name, after in cost_tables(planner).items():
        print(f"{name} cost table, ms (start-up sweep -> after serving, samples):")
        print_cost_table(startup_table[name], after)
    if profile is not None:
        print("measured draft stage by depth, ms:",
              {d: round(ms, 2) for d, ms in profile.draft_depth_ms.items()})


def cost_tables(planner) -> dict:
    """The planner's non-empty cost tables as JSON."""
    out = {}
    for name in ("target", "draft", "depth"):
        table = getattr(planner, f"{name}_costs", None)
        if table is not None and not table.is_empty:
            out[name] = table.to_json()
    return out


def print_cost_table(before: dict, after: dict) -> None:
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
