"""`lightspec-convert`: Hugging Face checkpoint directory -> converted lightspec_jax directory."""

from __future__ import annotations

import argparse
import sys
import time

from . import CheckpointError, convert_qwen3
from .qwen3 import param_count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lightspec-convert",
        description="Convert a Hugging Face Qwen3 checkpoint (config.json + safetensors, single "
                    "or sharded) into lightspec_jax's orbax format. Nothing is downloaded.")
    parser.add_argument("hf_dir", help="Hugging Face checkpoint directory")
    parser.add_argument("out_dir", help="output directory (created; must not hold a conversion)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="parameter dtype to store (default: bfloat16)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        model = convert_qwen3(args.hf_dir, args.out_dir, dtype=args.dtype)
    except CheckpointError as e:
        print(f"lightspec-convert: error: {e}", file=sys.stderr)
        return 2
    print(f"converted {args.hf_dir} -> {args.out_dir}: qwen3, {param_count(model):,} parameters, "
          f"{args.dtype}, {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
