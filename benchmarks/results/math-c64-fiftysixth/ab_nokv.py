"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftysixth/ab_nokv.py POLICY_AB_ARGS)
policy_ab where variants labelled *_nokv get an Eagle3 drafter that writes nothing: its
prompt rows and its floor steps' rows leave the drafter's cache as it was (the runner's
deferral path, with a record and a catch-up that do nothing). Only meaningful with
force_depth=0: it never drafts, so its output stays the target's, and it reads what a floor
that deferred all of the drafter's K/V at no cost would reach (an upper bound). Variants
labelled *_unpriced (with force_depth=0) decide the floor without pricing any depth: what the
planner's host time is at the floor when it prices nothing."""
import sys
sys.path.insert(0, "benchmarks")
import ab_variants
import policy_ab
from lightspec_jax.drafters import Eagle3Drafter

NOKV = {"on": False}
orig_init, orig_prefill = Eagle3Drafter.__init__, Eagle3Drafter.prefill


def init(self, model):
    orig_init(self, model)
    self._nokv = NOKV["on"]


Eagle3Drafter.__init__ = init
Eagle3Drafter.catches_up = property(lambda self: self._nokv)
Eagle3Drafter.prefill = (lambda self, p, cache, rows, *, target_embed:
                         cache if self._nokv else orig_prefill(self, p, cache, rows,
                                                               target_embed=target_embed))
Eagle3Drafter.record = lambda self, p, cache, rows: cache
Eagle3Drafter.catch_up = lambda self, p, cache, *, seq_len, window: cache
orig_build = ab_variants.build


def build(variant, *a, **k):
    NOKV["on"] = "_nokv" in variant.label
    try:
        engine = orig_build(variant, *a, **k)
    finally:
        NOKV["on"] = False
    if "_nokv" in variant.label:
        assert engine.runner.floor_buckets, "the _nokv engine does not defer"
    if "_unpriced" in variant.label:  # the floor decided without pricing anything
        planner = engine.planner
        planner._next_depth = lambda costs, n: (0, 0.0)
        planner._rival = lambda depth, best_j: None
    return engine


policy_ab.build = build
policy_ab.main()
