#!/usr/bin/env bash
# Configures, builds and runs every test (GPU tests are reported as skipped without a GPU).
#   BUILD_DIR (default build), JOBS (default 2), CTEST_ARGS (extra ctest arguments, e.g. -LE compile),
#   extra CMake options as arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" "$@"
cmake --build "$build" -j "${JOBS:-2}"
# shellcheck disable=SC2086  # CTEST_ARGS is a list of arguments
ctest --test-dir "$build" --output-on-failure -j "${JOBS:-2}" ${CTEST_ARGS:-}
