"""`lightspec-bench sweep`: the start-up bucket sweep of a dynamic engine, printed and saved:
target verify and drafter commit ms per verify-row bucket, and draft-stage ms per depth."""

from __future__ import annotations

from .report import table
from .serve import build_engine, resolved_dtype


def sweep(args) -> dict:
    # The rows hold one request's context, the deepest drafts and their verify rows.
    engine = build_engine(args, policy="dynamic", depth=args.max_depth,
                          concurrency=args.max_num_seqs,
                          max_model_len=args.context + 2 * args.max_depth + 8,
                          longest_prompt=args.context,
                          cost_cache_dir=None)  # measure now, not last run's cached tables
    profile = engine.cost_profile
    if profile is None:
        raise SystemExit("lightspec-bench sweep: the engine measured no costs (its tables came "
                         "from a saved cost table); nothing to report")
    costs = profile.summary()
    rows = sorted(costs["verify_ms"])
    header, commit = ["verify rows B", "target verify ms"], costs.get("draft_commit_ms", {})
    if any((ms or 0) > 1e-3 for ms in commit.values()):  # nil (a placeholder) where the verify step
        # writes the drafter's cache and the draft step does the rest
        header.append("drafter commit ms")
    print(table(header, [[str(b), f"{costs['verify_ms'][b]:.3f}", _ms(commit.get(b))][:len(header)]
                         for b in rows]))
    print()
    print(table(["draft depth d", "drafting adds ms"],
                [[str(d), f"{ms:.3f}"] for d, ms in sorted(costs["draft_depth_ms"].items())],
                legend="drafting adds = a step's extra time for its draft step of depth d "
                       "(d tokens per request, all slots together)"))
    return {"command": "sweep", "dtype": resolved_dtype(args.dtype), **costs}


def _ms(value) -> str:
    return "-" if value is None else f"{value:.3f}"
