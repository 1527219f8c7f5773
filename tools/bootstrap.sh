#!/usr/bin/env bash
# Create .venv (once) and install gyre with its extras into it; re-install only when
# pyproject.toml or the list of extras changed. Run by run-demo.sh and run-tests.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${GYRE_PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "gyre needs Python 3.11 or newer (found: $("$python" --version 2>&1))" >&2
    exit 2
fi
if [ ! -x .venv/bin/python ]; then
    echo "creating .venv" >&2
    "$python" -m venv .venv
fi
# mooncake: the tests pull weights over Mooncake Transfer Engine (the OS's libibverbs1 is
# run-tests.sh's business).
extras="dev,train,mooncake"
stamp=".venv/.gyre-installed"
want="$({ cat pyproject.toml; echo "$extras"; } | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "installing gyre and its dependencies into .venv (torch is the CPU build 2.13.0)" >&2
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[$extras]"
    echo "$want" > "$stamp"
fi
