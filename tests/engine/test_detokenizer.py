"""Incremental detokenization: the text built from token-by-token updates is the text of the
whole sequence decoded at once (byte-level BPE splits characters over tokens)."""

import numpy as np
import pytest

from lightspec_jax.assets import tiny_pair
from lightspec_jax.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = ["def add(a, b):\n    return a + b\n", "naïve café — 3 × 4 = 12 ✓ 日本語のテキスト",
         "Tom has 3 apples. He buys 4 more. 🍎🍏 How many?"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(f"{tiny_pair().target}/tokenizer.json")


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_equals_whole(tokenizer, text):
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer)
    for n in range(1, len(ids) + 1):
        partial = detok.update(ids, n)
        assert tokenizer.decode(ids[:n]).startswith(partial)  # never emits what it takes back
    assert detok.update(ids, len(ids)) == tokenizer.decode(ids) == text


def test_random_steps_and_old_reports(tokenizer):
    """Several tokens per update (speculative steps), and an older report asked afterwards."""
    rng = np.random.default_rng(0)
    ids = tokenizer.encode(" ".join(TEXTS))
    detok, n = IncrementalDetokenizer(tokenizer), 0
    while n < len(ids):
        n = min(len(ids), n + int(rng.integers(1, 6)))
        detok.update(ids, n)
    assert detok.text == tokenizer.decode(ids)
    assert detok.update(ids, 5) == tokenizer.decode(ids[:5])  # an old output's text
