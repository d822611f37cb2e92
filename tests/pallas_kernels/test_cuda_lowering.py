"""Each Pallas kernel lowers for CUDA (Triton route) at real shapes, on a CPU-only machine.

Recipe from reference/jax-platform-notes.md: ``jax.export`` for platform "cuda" under an abstract
mesh whose abstract device is an H200, with the export safety check for the Triton custom call
disabled. This runs every Pallas -> Triton lowering rule at production shapes (Qwen3-14B with
an Eagle3 drafter: N=256 slots, K=11, B up to 3072 rows); PTX compilation itself still needs a
GPU.

Axis legend: N slots, K max draft depth, B verify rows, S stop ids.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import pytest
from jax import export

from lightspec_jax.pallas_kernels import FillResult, commit, fill, verify, verify_attention

# jax >= 0.11 warns at each Triton-route lowering; Triton is still our GPU route on purpose.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The Pallas Triton backend is deprecated:DeprecationWarning"
)

TRITON_CALL = "__gpu$xla.gpu.triton"
MOSAIC_CALLS = ("mosaic_gpu", "mosaic_gpu_v2")  # the Mosaic GPU custom call, by jax version
N, K, S = 256, 11, 8
ROW_BUCKETS = (N, 1024, N * (K + 1))  # 256 .. 3072


def h200_mesh():
    """An abstract one-device mesh of an H200. jax >= 0.11 needs it to lower for CUDA without a
    GPU; 0.10.2 already has the API, so the same recipe runs on every supported version."""
    version = jax.__version_info__
    if not all(hasattr(jax.sharding, a) for a in ("AbstractDevice", "use_abstract_mesh")):
        pytest.fail(
            f"jax {jax.__version__} lacks jax.sharding.AbstractDevice/use_abstract_mesh; "
            "this recipe needs jax >= 0.10.2"
        )
    if "abstract_device" not in inspect.signature(jax.sharding.AbstractMesh).parameters:
        pytest.fail(f"jax {version}: AbstractMesh takes no abstract_device; update the recipe")
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    return jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)


def lower_for_cuda(fn, *arg_specs, route: str = "triton") -> str:
    """The exported module's text; asserts that every kernel took ``route`` (triton|mosaic)."""
    calls = (TRITON_CALL,) + MOSAIC_CALLS
    with jax.sharding.use_abstract_mesh(h200_mesh()):
        exported = export.export(
            jax.jit(fn),
            platforms=("cuda",),
            disabled_checks=[export.DisabledSafetyCheck.custom_call(c) for c in calls],
        )(*arg_specs)
    text = exported.mlir_module()
    if route == "triton":
        assert "mosaic_gpu" not in text, "a kernel took the Mosaic GPU route instead of Triton"
    else:
        assert "mosaic_gpu" in text and TRITON_CALL not in text, "expected the Mosaic GPU route"
    return text


def spec(shape, dtype=jnp.int32):
    return jax.ShapeDtypeStruct(shape, dtype)


def fill_spec(num_rows: int) -> FillResult:
    return FillResult(
        lengths=spec((N,)),
        row_start=spec((N,)),
        slot_valid=spec((N,), jnp.bool_),
        row_slot=spec((num_rows,)),
        row_offset=spec((num_rows,)),
        row_valid=spec((num_rows,), jnp.bool_),
    )


@pytest.mark.parametrize("num_rows", ROW_BUCKETS)
def test_fill_lowers_to_triton(num_rows):
    text = lower_for_cuda(
        functools.partial(fill, num_rows=num_rows, impl="pallas"),
        spec((N, K), jnp.float32),
        spec((N,)),
        spec((N,), jnp.bool_),
    )
    assert text.count(TRITON_CALL) == 2
    assert "lightspec_fill_select" in text and "lightspec_fill_layout" in text


@pytest.mark.parametrize("num_rows", ROW_BUCKETS)
def test_verify_lowers_to_triton(num_rows):
    text = lower_for_cuda(
        functools.partial(verify, impl="pallas"),
        spec((num_rows,)),
        fill_spec(num_rows),
        spec((N, K)),
    )
    assert text.count(TRITON_CALL) == 1 and "lightspec_verify" in text


def test_commit_lowers_to_triton():
    num_rows = ROW_BUCKETS[-1]
    text = lower_for_cuda(
        functools.partial(commit, impl="pallas"),
        spec((N, K + 1)),  # out_tokens
        spec((N,)),  # num_new
        spec((N,)),  # accepted
        fill_spec(num_rows),
        spec((N,)),  # seq_len
        spec((N,), jnp.bool_),  # active
        spec((N, S)),  # stop_ids
        spec((N,)),  # remaining
    )
    assert text.count(TRITON_CALL) == 1 and "lightspec_commit_tokens" in text


# Qwen3-14B attention: 40 query heads over 8 KV heads (Q/G = 5, padded to 8 in the kernel),
# head_dim 128, 4096-token strips, bf16; the model passes the whole [L, N, S, G, D] cache.
ATTN_Q, ATTN_G, ATTN_D, ATTN_S, ATTN_L = 40, 8, 128, 4096, 40


@pytest.mark.parametrize("num_rows", ROW_BUCKETS)
@pytest.mark.parametrize("with_layer", [False, True])
def test_verify_attention_lowers_to_triton(num_rows, with_layer):
    cache_shape = (ATTN_L,) * with_layer + (N, ATTN_S, ATTN_G, ATTN_D)
    args = [spec((num_rows, ATTN_Q, ATTN_D), jnp.bfloat16), spec(cache_shape, jnp.bfloat16),
            spec(cache_shape, jnp.bfloat16), spec((num_rows,)), spec((num_rows,))]
    if with_layer:
        fn = lambda q, k, v, s, p, layer: verify_attention(  # noqa: E731
            q, k, v, s, p, layer=layer, impl="pallas")
        args.append(spec(()))
    else:
        fn = functools.partial(verify_attention, impl="pallas")
    text = lower_for_cuda(fn, *args)
    assert text.count(TRITON_CALL) == 1 and "lightspec_verify_attention" in text


@pytest.mark.parametrize("num_rows", ROW_BUCKETS)
def test_verify_attention_lowers_to_mosaic_gpu(num_rows):
    """The Mosaic GPU kernel at Qwen3-14B's shapes (the layer picked inside, as the models call
    it): every Mosaic GPU lowering rule, layouts and WGMMA operand checks included."""
    cache_shape = (ATTN_L, N, ATTN_S, ATTN_G, ATTN_D)
    fn = lambda q, k, v, s, p, layer: verify_attention(  # noqa: E731
        q, k, v, s, p, layer=layer, impl="mosaic")
    text = lower_for_cuda(
        fn, spec((num_rows, ATTN_Q, ATTN_D), jnp.bfloat16), spec(cache_shape, jnp.bfloat16),
        spec(cache_shape, jnp.bfloat16), spec((num_rows,)), spec((num_rows,)), spec(()),
        route="mosaic")
    assert text.count("mosaic_gpu") >= 1


def test_verify_attention_mosaic_lowers_for_qwen3_0_6b():
    """Qwen3-0.6B: 16 query heads over 8 KV heads (Q/G = 2: 32 rows per program)."""
    cache_shape = (28, N, 1024, 8, 128)
    fn = lambda q, k, v, s, p, layer: verify_attention(  # noqa: E731
        q, k, v, s, p, layer=layer, impl="mosaic")
    lower_for_cuda(fn, spec((1024, 16, 128), jnp.bfloat16), spec(cache_shape, jnp.bfloat16),
                   spec(cache_shape, jnp.bfloat16), spec((1024,)), spec((1024,)), spec(()),
                   route="mosaic")
