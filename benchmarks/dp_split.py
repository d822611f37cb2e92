"""What data parallelism saves per device: the verify step at DP = 1, 2, 4 on forced CPU devices.

    python benchmarks/dp_split.py --out dp_split.json [--slots 16] [--repeats 3]

For each layout (one device, DP=2, DP=4; the shipped pair, float32, static K=3 with verify
buckets 16 / 32 / 64, and plain decoding):

  step      per verify bucket, and for the largest prefill bucket and the deepest draft
            step, the compiled step's FLOPs per device (XLA's cost_analysis of one device's
            partitioned module) and its collectives, in all and per layer
            (mesh_report.step_report: the scan's body);
  serving   tokens per second generating `--slots` seeded prompts x 48 tokens (EOS ignored),
            best of `--repeats`, the layouts interleaved within each repeat.

Forced devices share this machine's cores, so serving cannot run faster than one device
here: what it shows is the work each layout adds. Writes --out (JSON) and prints it. Run from
another checkout's root with PYTHONPATH=. to measure that checkout with this script.
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":  # forced host devices need setting before jax starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=4").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

LAYOUTS = {"single": {}, "dp2": dict(data_parallel_size=2), "dp4": dict(data_parallel_size=4)}


def build(layout: str, policy: str, slots: int):
    from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
    from lightspec_jax.assets import tiny_pair

    pair = tiny_pair()
    spec = {}
    if policy == "static":
        spec = dict(speculative=SpeculativeConfig(policy="static", num_speculative_tokens=3),
                    verify_buckets=(slots, 2 * slots, 4 * slots))
    config = EngineConfig(dtype="float32", max_num_seqs=slots, max_model_len=256,
                          compilation_cache_dir=None, show_progress=False, **spec,
                          **LAYOUTS[layout])
    return Engine.from_pretrained(pair.target, pair.drafter if spec else None, config=config)


def _one(compiled, num_layers: int) -> dict:
    from lightspec_jax.engine.mesh_report import step_report

    found = step_report(compiled, num_layers=num_layers)
    return dict(mflops_per_device=round(found["flops_per_device"] / 1e6, 1),
                collectives={op: n for op, n in found["module"].items() if n},
                per_layer={op: n for op, n in (found["loop"] or {}).items() if n})


def step_report(engine) -> dict:
    """Per verify bucket (greedy), the largest prefill bucket and the deepest draft step."""
    runner, layers = engine.runner, engine.model.config.num_layers
    out = {}
    for key, compiled in sorted(runner.decode_registry._compiled.items()):
        if key[1] == 0:
            out[f"verify B={key[0]}"] = _one(compiled, layers)
    key = max(runner.prefill_registry._compiled)
    out[f"prefill T={key[0]}"] = _one(runner.prefill_registry._compiled[key], layers)
    depth = max(runner.draft_registry._compiled)
    out[f"draft d={depth}"] = _one(runner.draft_registry._compiled[depth], layers)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="dp_split.json")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from lightspec_jax import SamplingParams

    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 8000, size=int(rng.integers(8, 40))).tolist()
               for _ in range(args.slots)]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    engines = {(layout, policy): build(layout, policy, args.slots)
               for layout in LAYOUTS for policy in ("none", "static")}
    report = {"steps": {layout: step_report(engines[layout, "static"]) for layout in LAYOUTS},
              "tok_s": {}}
    for engine in engines.values():
        engine.generate(prompts[:4], params)  # first runs of the executables
    best: dict = {}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            start = time.perf_counter()
            results = engine.generate(prompts, params)
            rate = sum(len(r.token_ids) for r in results) / (time.perf_counter() - start)
            best[name] = max(best.get(name, 0.0), rate)
    for (layout, policy), rate in best.items():
        report["tok_s"][f"{layout}/{policy}"] = round(rate, 1)
    for policy in ("none", "static"):
        for layout in ("dp2", "dp4"):
            report["tok_s"][f"{layout}/{policy} x single"] = round(
                best[layout, policy] / best["single", policy], 2)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
