"""What a policy_ab.py variant is, and the engine it builds: `[label=]policy[,option=value...]`
parsed into a Variant (planner options, a forced depth, a planner from another revision,
replayed plans, a cost-table file, ...; policy_ab.py's docstring lists them), and the engine
built for it with the benchmark's settings, its planner tuned as the variant says and its
refreshed cost tables kept apart from the shared cache when it is not the engine's own.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import dataclasses
import os
import shutil
import tempfile


@dataclasses.dataclass(frozen=True)
class Variant:
    label: str
    policy: str  # none | static | dynamic | dspark
    depth: int  # K (0 for none)
    options: dict  # planner options (make_planner keyword arguments)
    force_depth: int | None = None
    catch_up: bool = True  # False: the drafter commits at every step (Drafter.catches_up)
    planner_at: str | None = None  # a git revision whose planner package plans (None: today's)
    floor_timed: int | None = None  # one floor step in N timed (None: the engine's FLOOR_TIMED)
    replay_plans: bool = False  # timed repeats replay one pass's plans, the planner idle
    planner_busy: bool = False  # ... the live planner still working, its plans discarded
    plans_from: str | None = None  # ... the plans another (earlier) variant's pass recorded
    cost_table: str | None = None  # a cost-table file to start from, or "sweep" (None: cache)
    admission_interval: int = 1  # EngineConfig.admission_interval (any policy)
    prefill: str = "midpoints"  # prompt-chunk buckets: the benchmark's, or "pow2" (any policy)
    ngram_shared: bool | None = None  # SpeculativeConfig.ngram_shared (None: its default)

    @property
    def tuned(self) -> bool:
        """Whether the variant's planner, drafter or admissions differ from what the engine
        builds (an engine admitting in batches teaches its planner other periods)."""
        return bool(self.options or self.force_depth is not None or not self.catch_up
                    or self.planner_at or self.floor_timed is not None
                    or self.admission_interval != 1)


def parse_variant(text: str) -> Variant:
    """'[label=]policy[:K][,option=value...]' -> Variant."""
    from lightspec_jax.bench.policies import parse_policy

    head, *rest = text.split(",")
    label, eq, policy = head.partition("=")
    if not eq:
        label, policy = "", head
    name, k = parse_policy(policy)
    if name != "none" and k is None:
        k = 7
    options, force, catch_up, revision, timed, admission = {}, None, True, None, None, 1
    replay = busy = False
    source = table = None
    prefill = "midpoints"
    shared = None
    for item in rest:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise argparse.ArgumentTypeError(f"variant {text!r}: options are key=value, got "
                                             f"{item!r}")
        if key == "planner_at":  # a git revision, as written
            revision = value
            continue
        if key == "plans_from":  # a label, as written
            source = value
            continue
        if key == "prefill":
            if value not in ("midpoints", "pow2"):
                raise argparse.ArgumentTypeError(f"variant {text!r}: prefill is midpoints or "
                                                 f"pow2, got {value!r}")
            prefill = value
            continue
        if key == "cost_table":  # a path or "sweep", as written
            if value != "sweep" and not os.path.isfile(value):
                raise argparse.ArgumentTypeError(f"variant {text!r}: cost_table={value} is "
                                                 "neither a file nor 'sweep'")
            table = value
            continue
        word = {"true": "True", "false": "False", "none": "None"}.get(value.lower(), value)
        try:
            parsed = ast.literal_eval(word)
        except (ValueError, SyntaxError):
            raise argparse.ArgumentTypeError(f"variant {text!r}: cannot read {value!r} as a "
                                             "number, true, false or none") from None
        if key == "force_depth":
            force = int(parsed)
        elif key == "catch_up":
            catch_up = bool(parsed)
        elif key == "replay_plans":
            replay = bool(parsed)
        elif key == "planner_busy":
            busy = bool(parsed)
        elif key == "floor_timed":
            timed = int(parsed)
            if timed < 1:
                raise argparse.ArgumentTypeError(f"variant {text!r}: floor_timed must be >= 1")
        elif key == "ngram_shared":
            shared = bool(parsed)
        elif key == "admission_interval":
            admission = int(parsed)
            if admission < 1:
                raise argparse.ArgumentTypeError(f"variant {text!r}: admission_interval must "
                                                 "be >= 1")
        else:
            options[key] = parsed
    if (busy or source) and not replay:
        raise argparse.ArgumentTypeError(f"variant {text!r}: planner_busy and plans_from need "
                                         "replay_plans")
    tuned = (options or force is not None or not catch_up or revision or timed or replay
             or table)
    if tuned and name not in ("dynamic", "dspark"):
        raise argparse.ArgumentTypeError(f"variant {text!r}: planner options apply to dynamic "
                                         "and dspark policies only")
    return Variant(label=label or text, policy=name, depth=k or 0, options=options,
                   force_depth=force, catch_up=catch_up, planner_at=revision,
                   floor_timed=timed, replay_plans=replay, planner_busy=busy,
                   plans_from=source, cost_table=table, admission_interval=admission,
                   prefill=prefill, ngram_shared=shared)


def build(variant: Variant, args, concurrency: int, longest: int):
    import lightspec_jax.engine.planning as planning_module
    from lightspec_jax.bench.serve import build_engine, prefill_buckets
    from lightspec_jax.drafters import DraftLMDrafter
    from lightspec_jax.engine.buckets import powers_of_two

    make = today = planning_module.make_planner
    if variant.planner_at is not None:
        from planner_replay import make_planner_at

        make = make_planner_at(variant.planner_at)
    planning_module.make_planner = lambda *a, **kw: make(*a, **{**kw, **variant.options})
    DraftLMDrafter.catches_up = variant.catch_up  # read once, when the runner is built
    config = {}  # EngineConfig fields beside the benchmark's
    if variant.cost_table is not None:
        # A copy of its own: the engine writes its refreshed tables back to it.
        path = _private_table_path()
        if variant.cost_table != "sweep":
            shutil.copyfile(variant.cost_table, path)
        config["cost_table_path"] = path
    if variant.prefill == "pow2":  # the benchmark's buckets less their midpoints
        rows = prefill_buckets(concurrency, longest)
        config["row_buckets"] = powers_of_two(rows[-1], start=rows[0])
    try:
        engine = build_engine(args, policy=variant.policy, depth=variant.depth,
                              concurrency=concurrency, max_model_len=longest + args.max_tokens + 1,
                              longest_prompt=longest,
                              admission_interval=variant.admission_interval,
                              ngram_shared=variant.ngram_shared, **config)
    finally:
        planning_module.make_planner = today
        DraftLMDrafter.catches_up = True
    if variant.tuned and variant.cost_table is None:
        keep_tables_apart(engine)
    if variant.force_depth is not None:
        force_depth(engine, variant.force_depth, variant.label)
    if variant.floor_timed is not None and engine.planning.feedback is not None:
        engine.planning.feedback.floor_timed = variant.floor_timed
    return engine


def keep_tables_apart(engine) -> None:
    """Points the engine's cost-table writes at a temporary file: it has loaded the cache's
    tables (or swept and stored them) already, and its refresh goes no further."""
    feedback = engine.planning.feedback
    if feedback is None or feedback.cost_store is None or not feedback.cost_store.path:
        return
    feedback.cost_store.path = _private_table_path()


def _private_table_path() -> str:
    """A cost-table path in a temporary folder of its own, removed at exit."""
    folder = tempfile.mkdtemp(prefix="policy_ab_costs_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return os.path.join(folder, "costs.json")


def force_depth(engine, depth: int, label: str) -> None:
    """Makes the engine's dynamic planner draft `depth` after every step, probes off: what
    the free choice costs against a fixed depth in the same engine (the fill still chooses)."""
    planner = engine.planner
    if depth not in planner.spec.choices:
        raise SystemExit(f"{label}: force_depth={depth} is not one of the planner's "
                         f"depths {list(planner.spec.choices)}")
    decide = planner._next_depth  # still priced: plan() reads stage 2's grid

    def forced(costs, n):
        decide(costs, n)
        return depth, 0.0

    planner._next_depth = forced
    planner.options = dataclasses.replace(planner.options, explore_fraction=0.0)
