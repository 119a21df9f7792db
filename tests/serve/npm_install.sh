#!/usr/bin/env bash
# ctest fixture: installs the official OpenAI Node client (tests/serve/package.json) into WORK_DIR/node_modules.
# Exit 77 (reported by ctest as skipped, with the reason below) when node/npm are missing or the registry
# cannot be reached; the zipage-serve client tests then report themselves skipped too.
set -uo pipefail
src="$(cd "$(dirname "$0")" && pwd)"
work="${1:?usage: npm_install.sh WORK_DIR}"
mkdir -p "$work"
for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: $tool is not installed: the zipage-serve client tests need Node.js >= 20 and npm"
    exit 77
  fi
done
cp "$src/package.json" "$work/package.json"
if [ -f "$work/node_modules/openai/package.json" ] &&
   grep -q "\"version\": \"$(sed -n 's/.*"openai": "\(.*\)".*/\1/p' "$src/package.json")\"" "$work/node_modules/openai/package.json"; then
  echo "openai client already installed in $work/node_modules"
  exit 0
fi
cd "$work"
if ! timeout 300 npm install --no-audit --no-fund --omit=peer --loglevel=error; then
  echo "SKIPPED: 'npm install openai' failed (is the npm registry reachable?)"
  exit 77
fi
echo "installed openai $(node -p 'require("./node_modules/openai/package.json").version') into $work/node_modules"
