#!/usr/bin/env bash
# The one GPU-machine command (benchmarks/device_check.py says what it measures), from the repository root:
#   bash benchmarks/device_check.sh prepare   # here, with network: the wheels the device lacks -> benchmarks/.wheels
#   bash benchmarks/device_check.sh           # there (no network): install those, check versions, measure into $OUT
#   bash benchmarks/device_check.sh --tiny    # any CPU: every phase at tiny dims in seconds, the same report
# PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ "${1:-}" = prepare ]; then
  exec "$PY" benchmarks/device_wheels.py prepare
fi
# Only the carried wheels this Python lacks (or has below the floor) are installed, beside its own packages.
NEEDED=$("$PY" benchmarks/device_wheels.py select)
if [ -n "$NEEDED" ]; then
  TARGET="${TMPDIR:-/tmp}/qwen_device_site"
  # shellcheck disable=SC2086  # wheel paths hold no spaces (benchmarks/.wheels/NAME-VERSION-TAGS.whl)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$TARGET" $NEEDED
  export PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
# Under a per-setting cap a fragmented caching allocator can run out of memory with room to spare (the H100 run kept
# 6.9 GiB of cached blocks at 27 swapped): expandable segments map more of one segment instead. Recorded in the report.
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
exec "$PY" benchmarks/device_check.py "$@"
