"""Token streams and packed training batches.

Documents are tokenized, each followed by EOS, and concatenated into one stream; a batch is B
windows at seeded random offsets (the step number is part of the seed, so a resumed run sees
the same batches). Windows cross document boundaries, as in GPT-style packed pre-training: the
model learns that text after EOS starts afresh.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class TokenStream:
    train: np.ndarray  # [N] int32
    valid: np.ndarray  # [M] int32, the held-out tail

    @classmethod
    def from_documents(cls, tokenizer, documents: list[str], *, eos_id: int,
                       valid_fraction: float = 0.01) -> "TokenStream":
        """tokenizer: a `tokenizers.Tokenizer` (batch encoding runs in parallel in Rust)."""
        encoded = tokenizer.encode_batch(documents, add_special_tokens=False)
        pieces = [np.asarray(e.ids + [eos_id], np.int32) for e in encoded]
        stream = np.concatenate(pieces) if pieces else np.zeros((0,), np.int32)
        cut = len(stream) - max(1, int(len(stream) * valid_fraction))
        return cls(stream[:cut], stream[cut:])

    def windows(self, step: int, *, batch_size: int, length: int, seed: int,
                split: str = "train") -> np.ndarray:
        """[batch_size, length] windows for `step` (deterministic in (seed, step))."""
        data = self.train if split == "train" else self.valid
        if len(data) < length + 1:
            raise ValueError(f"the {split} stream has {len(data)} tokens, fewer than one "
                             f"window of {length}: use a larger corpus or shorter sequences")
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, len(data) - length + 1, size=batch_size)
        return np.stack([data[s:s + length] for s in starts])
