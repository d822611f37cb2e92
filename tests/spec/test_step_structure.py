"""No device step makes the host wait: no branch and no loop of traced trip count.

On a GPU, XLA runs a `lax.cond` or a `while` whose trip count it cannot see by copying the
predicate to the host and waiting for it, so a dispatch that reaches one blocks until the device
has finished everything queued before it - and the host work meant to overlap the device (the
previous step's read-back, the next plan) waits too. The H200 check measured exactly that: a
plain step's host time equal to its device time, from the sampler's greedy branch. So every
executable the engine compiles, every variant, must trace to straight-line code and loops of
static length. The one exception is the CPU attention reference, whose loop runs over the
batch's live context; on a GPU the Pallas kernel replaces it and loops inside its program.
"""

import jax
import pytest
from jax.extend import core

from lightspec_jax.pallas_kernels.verify_attention import REFERENCE_LOOP_SCOPE

HOST_SYNCING = {"cond", "while"}


def _sub_jaxprs(value):
    if isinstance(value, core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, core.Jaxpr):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _sub_jaxprs(item)


def host_syncing_ops(jaxpr) -> list[str]:
    """Names (with their scope) of the cond / while equations anywhere in `jaxpr`, except the
    attention reference's block loop."""
    found = []
    for eqn in jaxpr.eqns:
        scope = str(eqn.source_info.name_stack)
        if eqn.primitive.name in HOST_SYNCING and REFERENCE_LOOP_SCOPE not in scope:
            found.append(f"{eqn.primitive.name} at {scope or '<top>'}")
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                found += host_syncing_ops(sub)
    return found


def registries(engine):
    runner = engine.runner
    return (runner.prefill_registry, runner.decode_registry, runner.draft_registry,
            runner.write_registry)


@pytest.mark.parametrize("name", ["eagle3_k5", "dynamic_k4", "sampling_k3", "ngram_k4", None])
def test_every_step_variant_is_free_of_host_syncs(name, spec_engines, plain_engine):
    engine = plain_engine if name is None else spec_engines(name)
    checked = 0
    for registry in registries(engine):
        for key, (fn, abstract_args, _) in registry._recipes.items():
            jaxpr = jax.make_jaxpr(fn)(*abstract_args).jaxpr
            assert host_syncing_ops(jaxpr) == [], (registry.name, key)
            checked += 1
    assert checked >= 3 * len(engine.runner.decode_registry.sizes)  # every sampling mode


def test_the_check_sees_a_branch_and_a_traced_loop():
    import jax.numpy as jnp

    def branchy(x, n):
        y = jax.lax.cond(x.sum() > 0, lambda v: v + 1, lambda v: v - 1, x)
        return jax.lax.fori_loop(0, n, lambda i, v: v * 2, y)

    def static(x):
        return jax.lax.fori_loop(0, 4, lambda i, v: v * 2, x)

    x = jnp.ones(3)
    found = host_syncing_ops(jax.make_jaxpr(branchy)(x, 3).jaxpr)
    assert sorted(op.split()[0] for op in found) == ["cond", "while"]
    assert host_syncing_ops(jax.make_jaxpr(static)(x).jaxpr) == []
