#!/usr/bin/env bash
# Device check on the H200 (jax 0.11.2 preinstalled, Python 3.12, no network), <= 8 minutes:
#   bash benchmarks/h200_check.sh OUT_DIR [--dry-run]
# Installs this checkout without touching dependencies, then runs benchmarks/h200_check.py,
# which writes OUT_DIR/h200_check.json, OUT_DIR/summary.txt, OUT_DIR/kernel_tests.xml and
# OUT_DIR/log.txt.
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 OUT_DIR [--dry-run]" >&2
  exit 2
fi
out_dir=$1
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
mkdir -p "$out_dir"
cd "$root"
# --no-deps: no network there; jax, flax, optax, orbax come preinstalled.
"$py" -m pip install --quiet --no-deps --no-build-isolation -e . >"$out_dir/pip.log" 2>&1 \
  || { echo "pip install failed, see $out_dir/pip.log" >&2; exit 1; }
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# GEMMs go to cuBLAS with its own heuristics, not autotuned: the check compiles ~40 shapes in
# its 8 minutes. (Autotuning off alone left XLA's Triton GEMMs on a default tile: the first H200
# run measured 13 TFLOP/s in the Qwen3-14B verify step.) The flags are kept only if XLA knows
# them, since an unknown XLA flag aborts the process.
if [[ " $* " != *" --dry-run "* ]]; then
  flag="--xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0"
  if XLA_FLAGS="${XLA_FLAGS:-} $flag" "$py" -c "import jax; jax.numpy.ones(4).block_until_ready()" \
      >/dev/null 2>&1; then
    export XLA_FLAGS="${XLA_FLAGS:-} $flag"
  fi
fi
"$py" -c "import jax, os; print('jax', jax.__version__, jax.devices(), os.environ.get('XLA_FLAGS'))"
"$py" benchmarks/h200_check.py "$out_dir" "$@" 2>&1 | tee "$out_dir/log.txt"
