"""A thin wrapper over a Hugging Face `tokenizer.json` (the `tokenizers` library)."""

from __future__ import annotations

import json
import os


class Tokenizer:
    def __init__(self, inner):
        self._inner = inner

    @classmethod
    def from_file(cls, path: str) -> "Tokenizer":
        from tokenizers import Tokenizer as HFTokenizer
        return cls(HFTokenizer.from_file(path))

    @property
    def vocab_size(self) -> int:
        return self._inner.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        # Chat templates and BOS handling belong to the caller; Qwen3 adds no BOS.
        return self._inner.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._inner.decode(ids, skip_special_tokens=False)


def load_eos_ids(directory: str) -> set[int]:
    """EOS ids from generation_config.json (what transformers' generate stops on), if present."""
    path = os.path.join(directory, "generation_config.json")
    if not os.path.isfile(path):
        return set()
    with open(path) as f:
        eos = json.load(f).get("eos_token_id")
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {int(eos)}
