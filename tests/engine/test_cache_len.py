"""KV strip lengths the engine allocates: whole 128-position blocks for the reference attention's
blockwise read, and always a multiple of 16 - the GPU attention kernel's smallest KV tile. (The first H200
run of the device check failed every serving engine on a 97-position cache.)"""

from __future__ import annotations

import pytest

from lightspec_jax.engine.shapes import _cache_len
from lightspec_jax.pallas_kernels import CACHE_LEN_MULTIPLE


@pytest.mark.parametrize("max_model_len", [1, 15, 16, 17, 97, 119, 128, 129, 2048, 2070])
def test_cache_len_fits_both_attention_paths(max_model_len):
    length = _cache_len(max_model_len)
    assert length >= max_model_len
    assert length % CACHE_LEN_MULTIPLE == 0
    if max_model_len > 128:
        assert length % 128 == 0 and length - max_model_len < 128
    else:
        assert length - max_model_len < CACHE_LEN_MULTIPLE
