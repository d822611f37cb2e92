#!/usr/bin/env bash
# Device check on the H200 (jax 0.11.2 preinstalled, Python 3.12, no network), <= 8 minutes:
#   bash benchmarks/h200_check.sh OUT_DIR [--dry-run]
# Installs this checkout without touching dependencies, then runs benchmarks/h200_check.py,
# which writes OUT_DIR/h200_check.json, OUT_DIR/summary.txt and OUT_DIR/kernel_tests.xml.
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 OUT_DIR [--dry-run]" >&2
  exit 2
fi
out_dir=$1
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out_dir"
cd "$root"
# --no-deps: no network there; jax, flax, optax, orbax come preinstalled.
python -m pip install --quiet --no-deps --no-build-isolation -e . >"$out_dir/pip.log" 2>&1 \
  || { echo "pip install failed, see $out_dir/pip.log" >&2; exit 1; }
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -c "import jax; print('jax', jax.__version__, jax.devices())"
exec python benchmarks/h200_check.py "$out_dir" "$@" 2>&1 | tee "$out_dir/log.txt"
