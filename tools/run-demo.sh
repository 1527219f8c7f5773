#!/usr/bin/env bash
# The main job on the embedded default: `bash tools/run-demo.sh [gyre demo options]`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/tools/bootstrap.sh"
exec "$root/.venv/bin/gyre" demo "$@"
