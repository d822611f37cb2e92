"""Writes a random-weight Qwen3 target + Eagle3 drafter pair in Hugging Face layout.

The shape of the benchmark target (hidden 256, 8 layers, 4/2 heads, head_dim 64, intermediate
768, vocab 8192, tied), so `lightspec-bench sweep|serve --target OUT/target --drafter
OUT/drafter` can measure device costs without a trained pair (serve needs --synthetic then).

    python benchmarks/random_pair.py OUT
"""

from __future__ import annotations

import os
import sys

from spec_static import SHAPE


def main(out: str) -> None:
    from flax import nnx

    from lightspec_jax.checkpoint import save_eagle3_hf, save_qwen3_hf
    from lightspec_jax.models import Eagle3, Eagle3Config, Qwen3, Qwen3Config

    cfg = Qwen3Config(**SHAPE)
    save_qwen3_hf(Qwen3(cfg, rngs=nnx.Rngs(0)), os.path.join(out, "target"))
    save_eagle3_hf(Eagle3(Eagle3Config.for_target(cfg), rngs=nnx.Rngs(1)),
                   os.path.join(out, "drafter"))
    print(f"wrote {out}/target and {out}/drafter")


if __name__ == "__main__":
    main(sys.argv[1])
