#!/usr/bin/env bash
# Install the pinned Claude Code CLI (the harness of the end-to-end tests) under .gyre/claude.
# Prints the path of the `claude` executable; exits non-zero when npm cannot install it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${GYRE_CLAUDE_CODE_VERSION:-2.1.332}"
prefix="$root/.gyre/claude"
bin="$prefix/node_modules/.bin/claude"
if [ ! -x "$bin" ] || ! "$bin" --version 2>/dev/null | grep -q "$version"; then
    command -v npm >/dev/null || { echo "npm is not installed" >&2; exit 3; }
    mkdir -p "$prefix"
    npm install --silent --no-audit --no-fund --prefix "$prefix" "@anthropic-ai/claude-code@$version" >&2
fi
echo "$bin"
