"""What a decode step costs under each verification mode, on the shipped tiny pair.

One static engine per mode (exact match, probabilistic) at c = 16, K = 3. Each (bucket B,
depth d) is timed back to back over `--steps` steps from the sweep's synthetic state (every
slot active, full proposals re-armed before each step), once with greedy requests (the
GREEDY executable, which both modes share) and once with every request at temperature 0.7
(the DRAW executable, where probabilistic verification adds a softmax, a dense q and a
residual draw over the vocabulary per verify row, and the draft step samples from its top-M
distribution). Modes alternate within a repeat; the table gives the median over repeats.

    python benchmarks/verification_costs.py --repeats 3 --out verification_costs.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

PAIR = os.path.join(os.path.dirname(__file__), "..", "lightspec_jax", "assets", "tiny-pair")


def _engine(verification: str):
    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig

    config = EngineConfig(max_num_seqs=16, max_model_len=256, verify_buckets=(16, 32, 64),
                          show_progress=False, refresh_costs=False,
                          speculative=SpeculativeConfig(policy="static", num_speculative_tokens=3,
                                                        verification=verification))
    return Engine.from_pretrained(os.path.join(PAIR, "target"), os.path.join(PAIR, "drafter"),
                                  config=config)


def _time(engine, rows: int, depth: int, temperature: float, steps: int) -> float:
    """ms per step of `steps` back-to-back decode steps (after 3 untimed ones)."""
    import jax
    import jax.numpy as jnp

    from lightspec_jax.engine import costs
    from lightspec_jax.sampling import SampleMode

    runner = engine.runner
    extra = runner.verifier.empty_inputs(runner.num_slots, runner.max_depth)
    mode = SampleMode.DRAW if temperature > 0 else SampleMode.GREEDY
    runner.state = costs._synthetic_state(runner, 64, runner.num_slots)._replace(
        temperature=jnp.full((runner.num_slots,), temperature, jnp.float32))
    for i in range(steps + 3):
        if i == 3:
            jax.block_until_ready(runner.state)
            start = time.perf_counter()
        runner.state = costs._rearm(runner.state)
        readback, _ = runner.decode(rows, depth, extra, mode=mode)
    jax.block_until_ready((readback, runner.state))
    return 1e3 * (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default="verification_costs.json")
    args = parser.parse_args()
    engines = {mode: _engine(mode) for mode in ("exact", "probabilistic")}
    cells = [(rows, depth, t) for rows in (16, 64) for depth in (0, 3) for t in (0.0, 0.7)]
    times = {(mode, *cell): [] for mode in engines for cell in cells}
    for _ in range(args.repeats):
        for cell in cells:
            for mode, engine in engines.items():
                times[(mode, *cell)].append(_time(engine, *cell, steps=args.steps))
    rows = []
    print(f"{'B':>3} {'d':>2} {'T':>4} {'exact ms':>9} {'prob ms':>8} {'prob/exact':>10}")
    for rows_, depth, t in cells:
        exact = statistics.median(times[("exact", rows_, depth, t)])
        prob = statistics.median(times[("probabilistic", rows_, depth, t)])
        print(f"{rows_:>3} {depth:>2} {t:>4} {exact:>9.2f} {prob:>8.2f} {prob / exact:>10.2f}")
        rows.append(dict(rows=rows_, depth=depth, temperature=t, exact_ms=exact,
                         probabilistic_ms=prob, ratio=prob / exact))
    with open(args.out, "w") as f:
        json.dump({"command": "python benchmarks/verification_costs.py "
                              f"--repeats {args.repeats} --steps {args.steps}",
                   "rows": rows, "samples": {"|".join(map(str, k)): v for k, v in times.items()}},
                  f, indent=2)


if __name__ == "__main__":
    main()
