#!/usr/bin/env bash
# Configures, builds and runs every test (GPU tests are reported as skipped without a GPU).
#   BUILD_DIR (default build), JOBS (default 2), extra CMake options as arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" "$@"
cmake --build "$build" -j "${JOBS:-2}"
ctest --test-dir "$build" --output-on-failure -j "${JOBS:-2}"
