"""First and second start of the same dynamic engine, each in a new process.

The first start compiles every bucket and runs the bucket sweep; the second finds both on
disk (the persistent compilation cache and the cost-table cache beside it). Both use a fresh
cache folder made for this run, so nothing from earlier runs is reused.

    python benchmarks/second_start.py --concurrency 16 --max-depth 7
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = """
import json, os, sys, time
start = time.perf_counter()
from lightspec_jax import Engine, EngineConfig, SpeculativeConfig
from lightspec_jax.assets import tiny_pair
from lightspec_jax.engine.buckets import concurrency_buckets
c, k = int(sys.argv[1]), int(sys.argv[2])
pair = tiny_pair()
config = EngineConfig(max_num_seqs=c, max_model_len=512, show_progress=False,
                      verify_buckets=concurrency_buckets(c, k),
                      speculative=SpeculativeConfig(policy="dynamic", num_speculative_tokens=k))
engine = Engine.from_pretrained(pair.target, drafter_path=pair.drafter, config=config)
print(json.dumps({"start_s": time.perf_counter() - start, "compile_s": engine.compile_seconds}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-depth", type=int, default=7)
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="lightspec-second-start-")
    env = {**os.environ, "XDG_CACHE_HOME": cache, "JAX_PLATFORMS": "cpu"}
    runs = []
    for name in ("first", "second"):
        out = subprocess.run([sys.executable, "-c", _CHILD, str(args.concurrency),
                              str(args.max_depth)], env=env, capture_output=True, text=True,
                             check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(name, runs[-1], flush=True)
    ratio = runs[1]["start_s"] / runs[0]["start_s"]
    print(f"second start / first start = {ratio:.2f} (goal <= 0.25)")


if __name__ == "__main__":
    main()
