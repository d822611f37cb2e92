"""(Scratch, kept with its results.) Compiles one speculative engine's programs (no persistent
compilation cache) and times a workload, under the XLA_FLAGS it is given.
Usage, from the repository root:
    XLA_FLAGS="--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false <more>" \
        python benchmarks/results/suite-time-fiftysixth/flag_probe.py"""
import os, sys, time
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np
import jax
from lightspec_jax import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from lightspec_jax.assets import tiny_pair
pair = tiny_pair()
t0 = time.perf_counter()
cfg = EngineConfig(max_num_seqs=8, dtype="float32", max_model_len=160, max_num_batched_tokens=32,
                   compilation_cache_dir=None, show_progress=False, verify_buckets=(8, 16, 32),
                   precompile_sampling="all",
                   speculative=SpeculativeConfig(policy="static", num_speculative_tokens=3))
eng = Engine.from_pretrained(pair.target, pair.drafter, config=cfg)
build = time.perf_counter() - t0
comp = eng.runner.compile_seconds
rng = np.random.default_rng(0)
prompts = [rng.integers(2, 2000, size=int(rng.integers(5, 40))).tolist() for _ in range(24)]
params = [SamplingParams(max_tokens=48, ignore_eos=True, temperature=float(rng.choice([0, 0.8])),
                         top_p=float(rng.choice([1.0, 0.9])), seed=i) for i in range(24)]
eng.generate(prompts, params)
runs = []
for _ in range(3):
    t = time.perf_counter(); eng.generate(prompts, params); runs.append(time.perf_counter() - t)
print(f"flags={os.environ.get('XLA_FLAGS','')!r} build {build:.1f}s compile {comp:.1f}s "
      f"run {min(runs):.3f}s (runs {' '.join(f'{r:.3f}' for r in runs)})", flush=True)
