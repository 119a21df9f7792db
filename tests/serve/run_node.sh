#!/usr/bin/env bash
# Runs one zipage-serve client test with Node; exit 77 (ctest: skipped) when Node is not installed.
if ! command -v node >/dev/null; then
  echo "SKIPPED: node is not installed: the zipage-serve client tests need Node.js >= 20"
  exit 77
fi
exec node "$@"
