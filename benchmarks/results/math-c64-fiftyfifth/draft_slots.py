"""(A scratch probe, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftyfifth/draft_slots.py)
One Eagle3 draft step of the shipped pair over 64 slots, with 1 or 64 of them drafting, and
the verify step of 16 and 64 rows beside it: ms a step, the median of 7 rounds of 20."""
import os, sys, time
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np, jax, jax.numpy as jnp
from lightspec_jax import EngineConfig, SpeculativeConfig
from lightspec_jax.assets import tiny_pair
from lightspec_jax.engine.loading import load_pretrained
from lightspec_jax.engine.runner import ModelRunner
from lightspec_jax.engine.verifier import ExactMatch
pair = tiny_pair(); S = 64; CTX = 128
config = EngineConfig(max_num_seqs=S, dtype="float32", show_progress=False,
    speculative=SpeculativeConfig(policy="dynamic", num_speculative_tokens=7))
model, drafter, _, _ = load_pretrained(pair.target, pair.drafter, config)
r = ModelRunner(model, drafter, num_slots=S, cache_len=512, max_depth=7,
    prefill_buckets=(16,), decode_buckets=(16, 64), draft_depths=(1, 3), verifier=ExactMatch(), show_progress=False)
def setup(k):
    act = jnp.arange(S) < k
    r.state = r.state._replace(seq_len=jnp.full((S,), CTX, jnp.int32), active=act,
                               remaining=jnp.where(act, 1 << 20, 0).astype(jnp.int32), drafting=act)
def t_draft(k, d, steps=20):
    setup(k)
    st = time.perf_counter()
    for _ in range(steps):
        r.state = r.state._replace(drafting=jnp.arange(S) < k)
        r.dcache, r.state = r.draft_registry(d, r._embed, r._d_leaves, r.dcache, r.state)
    jax.block_until_ready(r.state)
    return 1e3 * (time.perf_counter() - st) / steps
def t_verify(rows, k, steps=20):
    setup(k)
    st = time.perf_counter()
    for _ in range(steps):
        r.state = r.state._replace(seq_len=jnp.full((S,), CTX, jnp.int32))
        rb, _ = r.decode(rows, 0, span=1)
    rb.block_until_ready()
    return 1e3 * (time.perf_counter() - st) / steps
cases = [("draft d1 k=1", lambda: t_draft(1, 1)), ("draft d1 k=64", lambda: t_draft(64, 1)),
         ("draft d3 k=1", lambda: t_draft(1, 3)), ("draft d3 k=64", lambda: t_draft(64, 3)),
         ("verify 16 k=1", lambda: t_verify(16, 1)), ("verify 64 k=64", lambda: t_verify(64, 64))]
for _, f in cases: f()
ms = {n: [] for n, _ in cases}
for rep in range(7):
    for n, f in cases: ms[n].append(f())
for k, v in ms.items(): print(f"{k:16s} {np.median(v):7.2f} ms")
