"""What the no-speculation floor costs per drafter: a decode step that drafts nothing, against
a plain decode step, compiled steps timed back to back in one process.

    python benchmarks/floor_cost.py --slots 1 16 64 --out floor_cost.json [--repeats 11]

The shipped pair, float32, K = 7, every slot decoding at a 128-token context, one verify row
per slot (what a floor step after floor steps verifies). Per slot count, the runners' steps
are timed in turn within each repeat (50 steps back to back, then one wait), and the median
over repeats is reported, as a ratio to the plain step of the same repeat:

  plain          no drafter: a plain decode step
  eagle3         the verify step writes the Eagle3 layer's K/V (its cache kept current)
  dflash         the verify step writes the DFlash context K/V
  ngram          the verify step records the tokens (prompt lookup)
  draft_lm       the verify step runs the draft model's forward over the rows (commit)
  draft_lm/floor the verify step only records the rows; the draft model catches up later
                 (what a dynamic engine's floor runs: runner.ModelRunner defer_commit)

Run from another checkout's root with PYTHONPATH=. to measure that checkout with this script.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

K = 7
CONTEXT = 128
STEPS = 50


def build_runners(slots: int) -> dict:
    import jax.numpy as jnp

    from lightspec_jax import EngineConfig, SpeculativeConfig
    from lightspec_jax.assets import tiny_pair
    from lightspec_jax.drafters import NgramDrafter
    from lightspec_jax.engine.loading import load_pretrained
    from lightspec_jax.engine.runner import ModelRunner
    from lightspec_jax.engine.verifier import ExactMatch

    pair = tiny_pair()
    paths = {"plain": None, "eagle3": pair.drafter, "dflash": pair.dflash, "ngram": None,
             "draft_lm": pair.draft_lm, "draft_lm/floor": pair.draft_lm}
    runners = {}
    for name, path in paths.items():
        config = EngineConfig(max_num_seqs=slots, dtype="float32", show_progress=False,
                              speculative=SpeculativeConfig(
                                  policy="none" if path is None else "dynamic",
                                  num_speculative_tokens=K))
        model, drafter, _, _ = load_pretrained(pair.target, path, config)
        if name == "ngram":
            drafter = NgramDrafter(min_n=1, max_n=3)
        runner = ModelRunner(model, drafter, num_slots=slots, cache_len=2 * CONTEXT + 4 * K,
                             max_depth=0 if drafter is None else K, prefill_buckets=(16,),
                             decode_buckets=(slots,), draft_depths=(1,), verifier=ExactMatch(),
                             show_progress=False, defer_commit=name.endswith("/floor"))
        # Every slot decoding at CONTEXT with no proposal: one verify row each.
        runner.state = runner.state._replace(seq_len=jnp.full((slots,), CONTEXT, jnp.int32),
                                             active=jnp.ones((slots,), bool),
                                             remaining=jnp.full((slots,), 1 << 20, jnp.int32))
        runners[name] = runner
    return runners


def time_steps(runner, slots: int) -> float:
    """ms per step of STEPS floor steps dispatched back to back (the committed length moves
    on one token a step, so the state is rewound first)."""
    import jax.numpy as jnp

    runner.state = runner.state._replace(seq_len=jnp.full((slots,), CONTEXT, jnp.int32))
    runner.discard_catch_up()
    start = time.perf_counter()
    for _ in range(STEPS):
        readback, _ = runner.decode(slots, 0, span=1)
    readback.block_until_ready()
    return 1e3 * (time.perf_counter() - start) / STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    results = {}
    for slots in args.slots:
        runners = build_runners(slots)
        for runner in runners.values():
            time_steps(runner, slots)  # warm-up
        ms = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, runner in runners.items():
                ms[name].append(time_steps(runner, slots))
        plain = np.array(ms["plain"])
        results[slots] = {name: {"median_ms": float(np.median(t)),
                                 "x_plain": float(np.median(np.array(t) / plain))}
                          for name, t in ms.items()}
        print(f"slots {slots}: " + ", ".join(f"{name} {r['median_ms']:.2f} ms "
                                              f"({r['x_plain']:.3f}x)"
                                              for name, r in results[slots].items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python benchmarks/floor_cost.py", "slots": args.slots,
                       "repeats": args.repeats, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
