"""Markdown tables for simulator results (one table per workload profile, plus checks)."""

from __future__ import annotations

import numpy as np

from ..synthetic import AcceptanceModel
from .costmodel import RooflineCostModel

_MAIN = ("static-3", "static-11", "dynamic", "dspark", "oracle")


def format_report(results: list[dict], *, cost_name: str, command: str, wall_s: float,
                  jobs: int) -> str:
    by_key = {(r["profile"], r["concurrency"], r["policy"]): r for r in results}
    profiles = sorted({r["profile"] for r in results})
    seeds = len(results[0]["extra"].get("seeds", [0])) if results else 1
    pooled = f"; each cell {seeds} seeds pooled" if seeds > 1 else ""
    out = [f"Command: `{command}`  ", f"Cost model: {cost_name}; wall time {wall_s:.0f} s "
           f"with {jobs} worker process(es){pooled}.", ""]
    out += _calibration(profiles)
    out += ["Columns: tok/s = output tokens per simulated second over the saturated phase "
            "(prefill's first token and prefill time included); τ = tokens committed per "
            "request-step, bonus included; accept rate = accepted / verified draft tokens; "
            "verified rows include each request's target row (LightLLM's convention), real "
            "rows first and the compiled bucket run in parentheses; mean next d = mean draft "
            "depth chosen (0 = the floor, no drafts); probes = exploration steps of the dynamic "
            "planner; host-bound = share of steps whose host time exceeded their device time "
            "(prefill included).", ""]
    for profile in profiles:
        out += _profile_table(profile, by_key, [p for p in _MAIN])
    extra = sorted({r["policy"] for r in results if r["policy"] not in _MAIN})
    for profile in profiles:
        if any((profile, c, p) in by_key for c in _concurrencies(by_key, profile) for p in extra):
            out += _profile_table(profile, by_key, ["dynamic"] + extra, title="ablations")
    out += _bars(profiles, by_key)
    wasted = sum(r["wasted_tokens"] for r in results)
    out += [f"Tokens accepted past a request's end, all runs: {wasted} (the fill cuts each "
            "proposal at the request's remaining allowance, as the engine does).", ""]
    return "\n".join(out)


def _concurrencies(by_key, profile) -> list[int]:
    return sorted({c for (p, c, _) in by_key if p == profile})


def _profile_table(profile, by_key, policies, title="") -> list[str]:
    head = f"### {profile}" + (f" — {title}" if title else "")
    lines = [head, "",
             "| c | policy | tok/s | × static K=3 | × static K=11 | × oracle | τ | accept rate "
             "| verified rows / req-step | verified rows / step (bucket) | mean next d | probes "
             "| host-bound |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in _concurrencies(by_key, profile):
        base = {p: by_key.get((profile, c, p)) for p in ("static-3", "static-11", "oracle")}
        for policy in policies:
            r = by_key.get((profile, c, policy))
            if r is None:
                continue
            ratios = [f"{r['throughput'] / b['throughput']:.2f}" if b else "–"
                      for b in base.values()]
            lines.append(
                f"| {c} | {r['label']} | {r['throughput']:,.0f} | {' | '.join(ratios)} | "
                f"{r['acceptance_length']:.2f} | {100 * r['acceptance_rate']:.1f}% | "
                f"{r['rows_per_request_step']:.2f} | {r['fill_rows'] / r['steps']:.0f} "
                f"({r['bucket_rows'] / r['steps']:.0f}) | "
                f"{r['draft_depth_sum'] / r['steps']:.2f} | {r['probes']} | "
                f"{100 * r['host_bound_steps'] / r['steps']:.0f}% |")
    return lines + [""]


def _bars(profiles, by_key) -> list[str]:
    seeds = [r["extra"]["seeds"] for r in by_key.values() if "seeds" in r["extra"]]
    lines = ["### Bars", ""]
    if seeds:
        lines += [f"Pooled over {len(seeds[0])} seeds; seeds held: in how many of them on their "
                  "own dynamic reached the best static (and 0.9x the oracle).", ""]
    # The informed oracle (oracle.InformedOracle), where it ran: the reference without hindsight.
    informed = any(p == "informed" for (_, _, p) in by_key)
    if informed:
        lines += ["Informed: the informed oracle, which knows each request's acceptance "
                  "probabilities every step but not the draws (no hindsight).", ""]
    lines += ["| profile | c | dynamic / best static | dynamic / oracle | dynamic ≥ best static "
              "| dynamic ≥ 0.9 oracle |" + (" seeds held |" if seeds else "")
              + (" dynamic / informed | informed / oracle |" if informed else ""),
              "|---|---:|---:|---:|---|---|" + ("---:|" if seeds else "")
              + ("---:|---:|" if informed else "")]
    for profile in profiles:
        for c in _concurrencies(by_key, profile):
            r = {p: by_key.get((profile, c, p)) for p in _MAIN}
            if not (r["dynamic"] and r["static-3"] and r["static-11"] and r["oracle"]):
                continue
            dyn = r["dynamic"]["throughput"]
            best = max(r["static-3"]["throughput"], r["static-11"]["throughput"])
            orc = dyn / r["oracle"]["throughput"]
            bound = by_key.get((profile, c, "informed"))
            lines.append(f"| {profile} | {c} | {dyn / best:.3f} | {orc:.3f} | "
                         f"{'yes' if dyn >= best else 'NO'} | {'yes' if orc >= 0.9 else 'NO'} |"
                         + (f" {_seeds_held(r)} |" if seeds else "")
                         + ((f" {dyn / bound['throughput']:.3f} | "
                             f"{bound['throughput'] / r['oracle']['throughput']:.3f} |"
                             if bound else " – | – |") if informed else ""))
    r = {p: by_key.get(("chat", 256, p)) for p in ("dynamic", "static-11")}
    if all(r.values()):
        gain = r["dynamic"]["throughput"] / r["static-11"]["throughput"] - 1
        fewer = r["static-11"]["rows_per_request_step"] / r["dynamic"]["rows_per_request_step"]
        lines += ["", f"chat, c=256: dynamic vs static K=11: {100 * gain:+.0f}% throughput with "
                      f"{fewer:.1f}x fewer verified rows per request-step (public LightSpec "
                      "claim, Qwen3-14B/H200/ShareGPT: +64% with 3.2x fewer verified tokens)."]
    return lines + [""]


def _seeds_held(r: dict) -> str:
    """'a (b)' of n: the seeds where dynamic alone reached the best static (0.9x the oracle)."""
    each = {p: np.asarray(r[p]["extra"]["seed_throughput"])
            for p in ("dynamic", "static-3", "static-11", "oracle")}
    dyn = each["dynamic"]
    best = dyn >= np.maximum(each["static-3"], each["static-11"])
    oracle = dyn >= 0.9 * each["oracle"]
    return f"{int(best.sum())} ({int(oracle.sum())}) of {dyn.size}"


def _calibration(profiles) -> list[str]:
    lines = ["### Workload calibration", "",
             "| profile | τ target @K=7 (source) | model τ @K=1/3/7/11 | conditional accept "
             "@pos 1 → 7 → 11 | confidence AUC |", "|---|---|---|---|---:|"]
    for name in profiles:
        m = AcceptanceModel.calibrated(name)
        taus = "/".join(f"{m.acceptance_length(k):.2f}" for k in (1, 3, 7, 11))
        cond = m.conditional(11)
        lines.append(f"| {name} | {m.profile.tau7:.2f} ({m.profile.tau7_source}) | {taus} | "
                     f"{cond[0]:.2f} → {cond[6]:.2f} → {cond[10]:.2f} | {_auc(m):.2f} |")
    cost = RooflineCostModel()
    rows = (1, 64, 256, 1024, 3072)
    lines += ["", "Roofline step times (ms) at 600 context tokens per request, N = min(rows, 256):",
              "", "| rows | " + " | ".join(str(b) for b in rows) + " |",
              "|---|" + "---:|" * len(rows),
              "| target verify | " + " | ".join(
                  f"{cost.target_ms(b, 600 * min(b, 256), min(b, 256)):.2f}" for b in rows) + " |",
              "| one draft forward | " + " | ".join(
                  f"{cost.draft_ms(b, 600 * min(b, 256), min(b, 256)):.2f}" for b in rows) + " |",
              ""]
    return lines


def _auc(model: AcceptanceModel, n: int = 20000) -> float:
    """Probability a random accepted draft position-1 token is more confident than a rejected
    one: how informative confidences are for the fill (0.5 = useless, 1 = perfect)."""
    rng = np.random.default_rng(0)
    quality = rng.normal(model.mu, model.profile.request_sigma, n)
    _, a, conf = model.step(rng, quality, model.initial_drift(rng, n), 1)
    pos, neg = conf[a >= 1, 0], conf[a == 0, 0]
    ranks = np.argsort(np.argsort(np.concatenate([pos, neg]))) + 1
    return float((ranks[:pos.size].sum() - pos.size * (pos.size + 1) / 2) / (pos.size * neg.size))
