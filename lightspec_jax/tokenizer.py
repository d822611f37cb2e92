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


class IncrementalDetokenizer:
    """Text of a growing token list, decoding only the tokens added since the last call.

    Byte-level BPE can split one character over several tokens, so a token decodes to text
    only in context: each call decodes a short window (from `prefix` to the end) and emits what
    extends the window's already-emitted part (`prefix` to `read`), holding tokens back while
    the window ends in an incomplete character (U+FFFD). The prefix/read-offset scheme follows
    vLLM's `detokenize_incrementally` (vllm-project/vllm, vllm/transformers_utils/detokenizer_utils.py).
    """

    def __init__(self, tokenizer: "Tokenizer"):
        self.tokenizer = tokenizer
        self.text = ""
        self.count = 0  # tokens whose text is in self.text (or held back)
        self._prefix = 0  # first token of the decode window
        self._read = 0  # tokens whose text is emitted

    def update(self, ids: list[int], upto: int) -> str:
        """Advances over ids[:upto] (the tokens seen so far must be a prefix of it)."""
        if upto < self.count:
            return self.tokenizer.decode(ids[:upto])  # an older output asked: decode it whole
        if upto > self.count:
            done = self.tokenizer.decode(ids[self._prefix:self._read])
            window = self.tokenizer.decode(ids[self._prefix:upto])
            if len(window) > len(done) and not window.endswith("\ufffd"):
                self.text += window[len(done):]
                self._prefix, self._read = self._read, upto
            self.count = upto
        return self.text


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
