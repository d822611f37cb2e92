"""Byte-level BPE tokenizer trained on the corpus with the `tokenizers` library.

Byte-level like Qwen's (GPT-2 pre-tokenization over bytes, so any text encodes and decodes
losslessly), with one special token, `<|endoftext|>`, that ends every training document and is
the model's EOS.
"""

from __future__ import annotations

from typing import Iterable

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN,)


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 8192, min_frequency: int = 2):
    """A `tokenizers.Tokenizer` (byte-level BPE) with `vocab_size` ids; EOS is id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (256 byte tokens "
                         f"plus {len(SPECIAL_TOKENS)} special), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def eos_id(tokenizer) -> int:
    token_id = tokenizer.token_to_id(EOS_TOKEN)
    if token_id is None:
        raise ValueError(f"the tokenizer has no {EOS_TOKEN!r} token")
    return token_id
