"""(Scratch, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftysixth/drain_cost.py)
Device time of decode steps on the shipped pair's dynamic runner (64 slots), N of them active
with `ctx` tokens each: the floor's bucket against a drafting step's, median of 5 x 10."""
import os, time
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np, jax.numpy as jnp
from lightspec_jax import EngineConfig, SpeculativeConfig
from lightspec_jax.assets import tiny_pair
from lightspec_jax.engine.loading import load_pretrained
from lightspec_jax.engine.runner import ModelRunner
from lightspec_jax.engine.verifier import ExactMatch
pair = tiny_pair(); S = 64
config = EngineConfig(max_num_seqs=S, dtype="float32", show_progress=False,
    speculative=SpeculativeConfig(policy="dynamic", num_speculative_tokens=7))
model, drafter, _, _ = load_pretrained(pair.target, pair.drafter, config)
r = ModelRunner(model, drafter, num_slots=S, cache_len=512, max_depth=7, prefill_buckets=(16,),
                decode_buckets=(16, 32, 64, 96, 128), draft_depths=(1, 2, 3), verifier=ExactMatch(),
                show_progress=False)
def setn(n, ctx):
    act = np.zeros(S, bool); act[:n] = True
    r.state = r.state._replace(seq_len=jnp.full((S,), ctx, jnp.int32), active=jnp.asarray(act),
                               remaining=jnp.full((S,), 1 << 20, jnp.int32))
def t(n, ctx, rows, d, steps=10):
    setn(n, ctx)
    st = time.perf_counter()
    for _ in range(steps):
        rb, _ = r.decode(rows, d, span=1)
        setn(n, ctx)
    rb.block_until_ready()
    return 1e3 * (time.perf_counter() - st) / steps
cases = [(24, 60, 32, 0), (24, 250, 32, 0), (24, 60, 96, 3), (24, 250, 96, 3), (64, 60, 64, 0),
         (64, 250, 64, 0), (64, 60, 128, 1), (24, 250, 96, 0), (24, 250, 32, 3)]
for c in cases: t(*c, steps=2)
ms = {c: [] for c in cases}
for rep in range(5):
    for c in cases: ms[c].append(t(*c))
for c, v in ms.items():
    print(f"N {c[0]:3d} ctx {c[1]:4d} rows {c[2]:4d} depth {c[3]}: {np.median(v):7.2f} ms")
