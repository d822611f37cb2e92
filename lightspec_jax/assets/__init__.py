"""Files that ship with the package: the tiny trained model pair.

    from lightspec_jax.assets import tiny_pair
    pair = tiny_pair()
    engine = Engine.from_pretrained(pair.target, drafter_path=pair.drafter, config=...)

tiny-pair/ holds a Qwen3-architecture target (Hugging Face layout, with its tokenizer), the
Eagle3 drafter trained for it, a draft LM (a 2-layer Qwen3 sharing the target's vocabulary,
usable as a drafter too), a DFlash block drafter (z-lab layout, block 8) and TRAINING.md, how
they were made (`lightspec-train-pair`).
"""

from __future__ import annotations

import os
from typing import NamedTuple

_TINY_PAIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny-pair")


class TinyPair(NamedTuple):
    """Checkpoint directories of the shipped pair (absolute paths)."""

    target: str  # Qwen3 target: config.json, model.safetensors, tokenizer.json
    drafter: str  # its Eagle3 drafter
    draft_lm: str  # a small Qwen3 draft LM for the same target
    dflash: str  # a DFlash block drafter for the same target


def tiny_pair() -> TinyPair:
    """The shipped tiny pair's directories; raises FileNotFoundError if the package was
    installed without its data files."""
    pair = TinyPair(target=os.path.join(_TINY_PAIR, "target"),
                    drafter=os.path.join(_TINY_PAIR, "drafter"),
                    draft_lm=os.path.join(_TINY_PAIR, "draft-lm"),
                    dflash=os.path.join(_TINY_PAIR, "dflash"))
    missing = [p for p in pair if not os.path.isfile(os.path.join(p, "config.json"))]
    if missing:
        raise FileNotFoundError(f"the shipped tiny pair is incomplete: no config.json in "
                                f"{missing}; reinstall lightspec-jax (its package data holds "
                                "lightspec_jax/assets/tiny-pair)")
    return pair
