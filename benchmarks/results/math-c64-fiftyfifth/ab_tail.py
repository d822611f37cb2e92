"""(A scratch prototype, kept with its results: run from the repository root as
    python benchmarks/results/math-c64-fiftyfifth/ab_tail.py POLICY_AB_ARGS)
policy_ab with two tail levers for variants whose label ends in:
  _d   Eagle3 draft steps sized to the decoding requests: the drafting slots gathered into a
       power-of-two bucket of rows (>= N) before the drafter runs, the proposals scattered back;
  _t   the same, plus verify buckets in powers of two under c / 4 (ab_small_buckets.py's).
One device, greedy exact match, the Eagle3 drafter only; not the engine's code."""
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, "benchmarks")
import policy_ab  # noqa: E402

import lightspec_jax.engine.buckets as B  # noqa: E402
from lightspec_jax.drafters.base import chain, support  # noqa: E402
from lightspec_jax.engine import engine as E  # noqa: E402
from lightspec_jax.engine import runner as R  # noqa: E402
from lightspec_jax.sampling import point_mass  # noqa: E402
from lightspec_jax.sampling import draw_proposal  # noqa: E402

orig_rule = B.concurrency_buckets
orig_build = policy_ab.build
orig_init = R.ModelRunner.__init__
orig_run = E.Engine._run
MODE = {"on": ""}


def small_all(concurrency, depth):
    out = set(orig_rule(concurrency, depth))
    b = 1
    while b < min(out):
        out.add(b)
        b *= 2
    return tuple(sorted(out))


def compact_draft(target_embed, drafter, verifier, d_leaves, dcache, state, *, depth, rows):
    """step.draft for Eagle3 over `rows` gathered drafting slots."""
    s = state.drafting.shape[0]
    k, m = state.draft_q_ids.shape[1:]
    assert verifier.proposal_sampling(state, target_embed.shape[0]) is None
    idx = jnp.nonzero(state.drafting, size=rows, fill_value=s)[0]  # [rows]
    safe = jnp.minimum(idx, s - 1)
    slots = jnp.where(idx < s, idx, s)
    model = drafter.module(d_leaves)
    embed = drafter._embed(target_embed)
    seq_len = state.seq_len[safe]
    last = state.last_token[safe]
    out = model(last, dcache.tail_features[safe], seq_len - 1, slots, dcache.kv, embed=embed,
                from_features=True)
    first = draw_proposal(out.logits, seq_len + 1, None, model.draft_to_target)

    def step(carry, token, i):
        kv, st = carry
        o = model(token, st, seq_len - 1 + i, slots, kv, embed=embed, from_features=False)
        return (o.cache, o.state), draw_proposal(o.logits, seq_len + 1 + i, None,
                                                 model.draft_to_target)

    (kv, _), proposal = chain(step, (out.cache, out.state), last, depth=depth, max_depth=k,
                              support=support(None), first=first)
    dcache = dcache._replace(kv=kv)
    got = jnp.zeros((s,), bool).at[idx].set(True, mode="drop")
    keep = state.drafting & got
    tokens = state.draft_tokens.at[idx].set(proposal.tokens, mode="drop")
    conf = state.draft_conf.at[idx].set(proposal.confidence, mode="drop")
    q_ids, q_probs = point_mass(tokens, m)
    kk = keep[:, None]
    return dcache, state._replace(
        draft_tokens=jnp.where(kk, tokens, state.draft_tokens),
        draft_conf=jnp.where(kk, conf, state.draft_conf),
        draft_q_ids=jnp.where(kk[..., None], q_ids, state.draft_q_ids),
        draft_q_probs=jnp.where(kk[..., None], q_probs, state.draft_q_probs),
        proposal_len=jnp.where(keep, depth,
                               jnp.where(state.drafting, 0, state.proposal_len)).astype(jnp.int32),
        drafting=jnp.zeros_like(state.drafting))


class Sized:
    """The runner's draft registry, calling (depth, rows) for fewer decoding requests."""

    def __init__(self, runner, registry, rows):
        self.runner, self.registry, self.rows = runner, registry, rows

    def __getattr__(self, name):
        return getattr(self.registry, name)

    @property
    def compiled(self):  # what warm_up runs: the engine's own keys
        return [key for key in self.registry.compiled if isinstance(key, int)]

    def __call__(self, depth, *args):
        n = getattr(self.runner, "_n_decoding", None)
        fit = [r for r in self.rows if n is not None and r >= n]
        key = (depth, fit[0]) if fit else depth
        return self.registry(key, *args)


def init(self, model, drafter, *a, **kw):
    orig_init(self, model, drafter, *a, **kw)
    if not MODE["on"] or drafter is None:
        return
    reg, verifier = self.draft_registry, kw["verifier"]
    n = self.num_slots if hasattr(self, "num_slots") else kw["num_slots"]
    rows = [r for r in (1, 2, 4, 8, 16, 32, 64, 128) if r < n]
    for depth in list(reg.defined):
        _, abstract, jit_kwargs = reg._recipes[depth]
        for r in rows:
            def fn(embed, d_leaves, dcache, state, depth=depth, r=r):
                return compact_draft(embed, drafter, verifier, d_leaves, dcache, state,
                                     depth=depth, rows=r)
            reg.define((depth, r), fn, *abstract, **jit_kwargs)
            reg.build((depth, r))
    self.draft_registry = Sized(self, reg, rows)


def run(self, batch):
    self.runner._n_decoding = batch.num_decoding
    return orig_run(self, batch)


def build(variant, *a, **k):
    tail, draft = variant.label.endswith("_t"), variant.label.endswith(("_t", "_d"))
    B.concurrency_buckets = small_all if tail else orig_rule
    MODE["on"] = "yes" if draft else ""
    try:
        return orig_build(variant, *a, **k)
    finally:
        B.concurrency_buckets = orig_rule
        MODE["on"] = ""


R.ModelRunner.__init__ = init
E.Engine._run = run
policy_ab.build = build
policy_ab.main()
