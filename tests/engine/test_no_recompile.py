"""Serving never compiles: every device step comes from the start-up registry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lightspec_jax import SamplingParams
from lightspec_jax.engine.buckets import CompileWatch, RecompileError, compile_event_count


def test_guard_fires_on_a_compile():
    with pytest.raises(RecompileError):
        with CompileWatch("test"):
            jax.jit(lambda x: x * 3 + 1)(jnp.ones(7))


def test_long_mixed_run_compiles_nothing(engine):
    rng = np.random.default_rng(0)
    registries = (engine.runner.prefill_registry, engine.runner.decode_registry)
    used = {r.name: set() for r in registries}

    def counting(registry):
        original = registry.pick

        def pick(n):
            used[registry.name].add(original(n))
            return original(n)
        return pick

    for registry in registries:  # instance attributes shadow the method; deleted below
        registry.pick = counting(registry)
    before = compile_event_count()
    try:
        step, next_id = 0, 0
        while step < 120 or engine.has_unfinished_requests():
            if step < 120 and rng.random() < 0.4:
                n = int(rng.choice([1, 3, 9, 14, 20, 45]))
                params = SamplingParams(max_tokens=int(rng.integers(1, 20)),
                                        temperature=float(rng.choice([0.0, 0.8])),
                                        top_k=int(rng.choice([0, 5])), ignore_eos=True)
                engine.add_request(f"mixed-{next_id}", rng.integers(0, 200, size=n).tolist(), params)
                next_id += 1
            if step % 17 == 5 and engine._requests:
                victim = next(iter(engine._requests.values()))
                if not victim.finished:
                    engine.abort(victim.request_id)
            engine.step()  # CompileWatch inside raises on any compile
            step += 1
    finally:
        for registry in registries:
            del registry.pick
    assert compile_event_count() == before
    for registry in registries:
        assert used[registry.name] == set(registry.sizes), registry.name


def test_precompiled_sampling_variants_serve_without_a_first_use_compile(hf_checkpoints):
    """precompile_sampling="all": a batch that samples and filters finds its steps compiled;
    by default ("none") they compile when first needed, and the config names its choices."""
    import dataclasses

    from lightspec_jax import Engine, EngineConfig
    from lightspec_jax.engine.buckets import lazy_compile_events

    directory, _ = hf_checkpoints["untied_sharded"]
    # (not conftest's ENGINE_CONFIG: in a whole-suite run `conftest` may name another dir's)
    config = EngineConfig(max_num_seqs=2, max_model_len=96, dtype="float32",
                          max_num_batched_tokens=8, row_buckets=(8,), compilation_cache_dir=None,
                          show_progress=False)
    params = [SamplingParams(max_tokens=6, temperature=0.9, top_p=0.8, seed=i, ignore_eos=True)
              for i in range(3)]
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    outputs = {}
    for mode in ("all", "none"):
        engine = Engine.from_pretrained(directory, config=dataclasses.replace(
            config, precompile_sampling=mode))
        before = lazy_compile_events()
        outputs[mode] = [o.token_ids for o in engine.generate(prompts, params)]
        assert (lazy_compile_events() == before) == (mode == "all"), mode
        del engine
    assert outputs["all"] == outputs["none"]  # the same executables, compiled earlier
    with pytest.raises(ValueError, match="precompile_sampling"):
        EngineConfig(precompile_sampling=True)


def test_compile_on_first_use_starts_with_nothing_compiled(engine):
    """compile_on_first_use=True: the engine compiles no step at start-up; each compiles the
    first time a batch needs it (declared, so forbid_recompile lets it through), buckets no
    batch needs never compile, and the tokens are the start-up-compiled engine's."""
    import dataclasses

    from lightspec_jax import Engine, EngineConfig
    from lightspec_jax.engine.buckets import lazy_compile_events

    lazy = Engine(engine.model, config=dataclasses.replace(engine.config,
                                                           compile_on_first_use=True))
    runner = lazy.runner
    registries = (runner.prefill_registry, runner.decode_registry, runner.write_registry)
    assert not any(r.compiled for r in registries)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    params = [SamplingParams(max_tokens=8, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0.9, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=7, ignore_eos=True)]
    before = lazy_compile_events()
    got = [o.token_ids for o in lazy.generate(prompts, params)]
    assert lazy_compile_events() > before
    assert got == [o.token_ids for o in engine.generate(prompts, params)]
    largest = max(runner.prefill_registry.sizes)  # 9 prompt rows never need it
    assert all(key[0] != largest for key in runner.prefill_registry.compiled)
    assert all(r.compiled for r in registries)
    with pytest.raises(ValueError, match="compile_on_first_use"):
        EngineConfig(compile_on_first_use="yes")


def test_gpu_compiler_options_compile_and_yield_to_xla_flags(monkeypatch):
    """On a GPU every device step compiles with GPU_COMPILER_OPTIONS (cuBLAS GEMMs), unless
    the user's XLA_FLAGS sets the flag; elsewhere with none. The option names must be ones this
    XLA knows (a misspelt one fails the compile, which XLA:CPU checks too)."""
    from lightspec_jax.engine import buckets

    monkeypatch.setenv("XLA_FLAGS", "")
    assert buckets.compiler_options("cpu") == {}
    assert buckets.compiler_options("gpu") == buckets.GPU_COMPILER_OPTIONS
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=true")
    assert buckets.compiler_options("gpu") == {}
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setattr(buckets, "compiler_options", lambda: buckets.GPU_COMPILER_OPTIONS)
    registry = buckets.BucketRegistry("gpu-options", (4,))
    registry.define(4, lambda x: x @ x, jax.ShapeDtypeStruct((4, 4), jnp.float32))
    registry.build(4)
    np.testing.assert_allclose(np.asarray(registry(4, jnp.eye(4))), np.eye(4))
