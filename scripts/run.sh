#!/usr/bin/env bash
# Builds zipage-generate and runs it (the bundled stories260K model unless --model is given).
#   scripts/run.sh --prompt "Once upon a time" -n 128
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DZIPAGE_BUILD_TESTS=OFF -DZIPAGE_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target zipage-generate -j "${JOBS:-2}" >/dev/null
if [ $# -eq 0 ]; then set -- --prompt "Once upon a time" -n 128; fi
exec "$build/examples/zipage-generate" "$@"
