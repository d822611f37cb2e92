"""(A scratch wrapper, kept with its results: run from the repository root as
    python benchmarks/results/floor-c64-fiftythird/ab_small_buckets.py POLICY_AB_ARGS;
    SMALL_BUCKETS=two for the second run's rule)
policy_ab with variants labelled *_sb given verify buckets down to 1 (powers of two below c/4)."""
import os
import sys
sys.path.insert(0, "benchmarks")
import policy_ab
import lightspec_jax.engine.buckets as B
orig_rule = B.concurrency_buckets
orig_build = policy_ab.build
def small_all(concurrency, depth):
    out = set(orig_rule(concurrency, depth))
    b = 1
    while b < min(out):
        out.add(b); b *= 2
    return tuple(sorted(out))
def small_two(concurrency, depth):
    """The second run's rule: c / 16 and c / 8 rows added (4 and 8 at c = 64)."""
    out = set(orig_rule(concurrency, depth))
    for factor in (1 / 16, 1 / 8):
        rows = int(concurrency * factor)
        if rows >= 1:
            out.add(rows)
    return tuple(sorted(out))
small = small_two if os.environ.get("SMALL_BUCKETS") == "two" else small_all
def build(variant, *a, **k):
    B.concurrency_buckets = small if variant.label.endswith("_sb") else orig_rule
    try:
        return orig_build(variant, *a, **k)
    finally:
        B.concurrency_buckets = orig_rule
policy_ab.build = build
policy_ab.main()
