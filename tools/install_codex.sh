#!/usr/bin/env bash
# Install the pinned Codex CLI (the harness of the Codex end-to-end test) under .gyre/codex.
# Prints the path of the `codex` executable; exits non-zero when npm cannot install it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${GYRE_CODEX_VERSION:-0.171.0}"
prefix="$root/.gyre/codex"
bin="$prefix/node_modules/.bin/codex"
if [ ! -x "$bin" ] || ! "$bin" --version 2>/dev/null | grep -q "$version"; then
    command -v npm >/dev/null || { echo "npm is not installed" >&2; exit 3; }
    mkdir -p "$prefix"
    npm install --silent --no-audit --no-fund --prefix "$prefix" "@openai/codex@$version" >&2
fi
echo "$bin"
