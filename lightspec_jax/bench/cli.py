"""`lightspec-bench`: the bucket sweep, the serving benchmark and the planner simulator.

    lightspec-bench serve      # short default on the shipped tiny pair
    lightspec-bench serve --target T --drafter D --workload sharegpt --concurrency 1 16 64 \
        --policies none static:3 static:11 dynamic --num-prompts 200
    lightspec-bench sweep --target T --drafter D --max-num-seqs 64 --max-depth 11
    lightspec-bench simulate --all

Every command takes Hugging Face or converted target paths (Eagle3 drafters in HF layout) and
writes a table to stdout plus JSON and a PNG plot into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                      "tiny-pair")


def _engine(args, *, policy: str, depth: int, concurrency: int, max_model_len: int, **extra):
    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig

    spec = (SpeculativeConfig() if policy == "none" else
            SpeculativeConfig(policy=policy, num_speculative_tokens=depth))
    config = EngineConfig(max_num_seqs=concurrency, max_model_len=max_model_len,
                          dtype=args.dtype, speculative=spec,
                          max_num_batched_tokens=max(256, concurrency),
                          verify_buckets=concurrency_buckets(concurrency, depth) if depth else None,
                          show_progress=False, **extra)
    return Engine.from_pretrained(args.target, None if policy == "none" else args.drafter,
                                  config=config)


def concurrency_buckets(concurrency: int, depth: int) -> tuple[int, ...]:
    """Verify buckets for `concurrency` slots up to full width: c x (1, 1.5, 2, 3, 4, 6, 8, ...)."""
    top = concurrency * (depth + 1)
    sizes = {top}
    for factor in (1, 1.5, 2, 3, 4, 6, 8, 12):
        rows = int(concurrency * factor)
        if 1 <= rows < top:
            sizes.add(rows)
    return tuple(sorted(sizes))


def parse_policy(text: str) -> tuple[str, int, int | None]:
    """'none' | 'static:K' | 'dynamic' | 'dynamic:K' | 'dspark[:K]' -> (policy, K or default)."""
    name, _, k = text.partition(":")
    if name not in ("none", "static", "dynamic", "dspark"):
        raise argparse.ArgumentTypeError(f"unknown policy {text!r}: use none, static:K, dynamic[:K] "
                                         "or dspark[:K]")
    if name == "static" and not k:
        raise argparse.ArgumentTypeError("static needs its depth, e.g. static:3")
    return name, int(k) if k else None


def serve(args) -> dict:
    from lightspec_jax import SamplingParams
    from lightspec_jax.tokenizer import Tokenizer

    from .workloads import load_workload

    tokenizer = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    rows = []
    for c in args.concurrency:
        items = load_workload(args.workload, tokenizer, args.num_prompts, seed=args.seed,
                              max_prompt_len=args.max_prompt_len)
        prompts = [it.prompt_token_ids for it in items]
        params = [SamplingParams(max_tokens=min(args.max_tokens, max(it.output_len, 1)),
                                 temperature=args.temperature, seed=i,
                                 ignore_eos=args.ignore_eos) for i, it in enumerate(items)]
        max_len = max(len(p) for p in prompts) + args.max_tokens + 1
        outputs = {}
        for name, k in args.policies:
            depth = 0 if name == "none" else (k or args.max_depth)
            start = time.perf_counter()
            engine = _engine(args, policy=name, depth=depth, concurrency=c, max_model_len=max_len,
                             synthetic_acceptance=args.synthetic if depth else None)
            startup = time.perf_counter() - start
            engine.generate(prompts[:min(c, len(prompts))], params[:min(c, len(prompts))])
            start = time.perf_counter()
            outs = engine.generate(prompts, params)
            wall = time.perf_counter() - start
            label = "none" if not depth else f"{name} K={depth}" if name == "static" else \
                f"{name} K<={depth}"
            row = {"concurrency": c, "policy": label, "tok_s": sum(len(o.token_ids) for o in outs) / wall,
                   "wall_s": wall, "startup_s": startup, "requests": len(outs)}
            if depth:
                m = [o.metrics for o in outs]
                summary = engine.stats.summary()
                acc, ver, st = (sum(x.accepted for x in m), sum(x.verified for x in m),
                                sum(x.steps for x in m))
                row.update(acceptance_rate=acc / max(ver, 1), acceptance_length=1 + acc / max(st, 1),
                           verify_rows_per_step=summary["verify_rows_per_step"],
                           mean_depth=summary["mean_draft_depth"],
                           host_ms_per_step=1e3 * wall / summary["spec_steps"])
            outputs[label] = [o.token_ids for o in outs]
            if not args.synthetic and args.temperature == 0 and "none" in outputs:
                row["identical_to_none"] = outputs[label] == outputs["none"]
            rows.append(row)
            print(_row_line(row), flush=True)
    return {"command": "serve", "workload": args.workload, "synthetic_acceptance": args.synthetic,
            "target": args.target, "drafter": args.drafter, "rows": rows}


def _row_line(r: dict) -> str:
    spec = (f"acc.rate {r['acceptance_rate']:.2f}  acc.len {r['acceptance_length']:.2f}  "
            f"rows/step {r['verify_rows_per_step']:.1f}  d {r['mean_depth']:.1f}"
            if "acceptance_rate" in r else "")
    return f"c={r['concurrency']:<4} {r['policy']:<16} {r['tok_s']:8.1f} tok/s  {spec}"


def sweep(args) -> dict:
    from lightspec_jax import EngineConfig, SpeculativeConfig  # noqa: F401 (import check)

    engine = _engine(args, policy="dynamic", depth=args.max_depth, concurrency=args.max_num_seqs,
                     max_model_len=args.context + 2 * args.max_depth + 8)
    profile = engine.cost_profile
    table = profile.summary()
    print("rows | verify ms | draft commit ms")
    for b in sorted(table["verify_ms"]):
        print(f"{b:5d} | {table['verify_ms'][b]:9.3f} | {table['draft_commit_ms'][b]:.3f}")
    print("draft depth ms:", {d: round(ms, 3) for d, ms in table["draft_depth_ms"].items()})
    return {"command": "sweep", "target": args.target, "drafter": args.drafter, **table}


def _plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if result["command"] == "sweep":
        rows = sorted(result["verify_ms"])
        ax.plot(rows, [result["verify_ms"][b] for b in rows], "o-", label="target verify")
        ax.plot(rows, [result["draft_commit_ms"][b] for b in rows], "s-", label="draft commit")
        ax.set_xlabel("verify rows B")
        ax.set_ylabel("ms")
    else:
        labels = list(dict.fromkeys(r["policy"] for r in result["rows"]))
        cs = list(dict.fromkeys(r["concurrency"] for r in result["rows"]))
        width = 0.8 / len(labels)
        for i, label in enumerate(labels):
            ys = [next((r["tok_s"] for r in result["rows"]
                        if r["policy"] == label and r["concurrency"] == c), 0) for c in cs]
            ax.bar([j + i * width for j in range(len(cs))], ys, width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cs))], [f"c={c}" for c in cs])
        ax.set_ylabel("tokens / s")
        if result.get("synthetic_acceptance"):
            ax.set_title(f"SYNTHETIC acceptance ({result['synthetic_acceptance']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lightspec-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=False)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", default=os.path.join(ASSETS, "target"),
                        help="Qwen3 target (HF or converted dir); default: the shipped tiny pair")
    common.add_argument("--drafter", default=os.path.join(ASSETS, "drafter"),
                        help="Eagle3 drafter (HF layout); default: the shipped tiny pair")
    common.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    common.add_argument("--out", default="lightspec-bench-out", help="folder for JSON and PNG")
    s = sub.add_parser("serve", parents=[common], help="serving benchmark over policies")
    s.add_argument("--workload", default="math", choices=("sharegpt", "humaneval", "math"))
    s.add_argument("--concurrency", type=int, nargs="+", default=[4])
    s.add_argument("--policies", type=parse_policy, nargs="+",
                   default=[("none", None), ("static", 3), ("dynamic", None)])
    s.add_argument("--max-depth", type=int, default=7, help="K for dynamic/dspark")
    s.add_argument("--num-prompts", type=int, default=16)
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--max-prompt-len", type=int, default=256)
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--ignore-eos", action="store_true")
    s.add_argument("--synthetic", choices=("chat", "code", "math"),
                   help="SYNTHETIC acceptance from a workload profile (random-weight models)")
    s.add_argument("--seed", type=int, default=0)
    w = sub.add_parser("sweep", parents=[common], help="cost per verify bucket and draft depth")
    w.add_argument("--max-num-seqs", type=int, default=16)
    w.add_argument("--max-depth", type=int, default=7)
    w.add_argument("--context", type=int, default=128)
    sub.add_parser("simulate", help="the planner simulator (all its flags pass through)",
                   add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "simulate":
        from lightspec_jax.planner.simulate import main as simulate_main
        return simulate_main(argv[1:])
    args = parser.parse_args(argv or ["serve"])
    for path, what in ((args.target, "target"), (args.drafter, "drafter")):
        if not os.path.isdir(path):
            parser.error(f"{what} {path!r} is not a directory")
    result = serve(args) if args.command == "serve" else sweep(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.command}.json"), "w") as f:
        json.dump(result, f, indent=2)
    _plot(result, os.path.join(args.out, f"{args.command}.png"))
    print(f"wrote {os.path.join(args.out, args.command)}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
