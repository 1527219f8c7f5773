#!/usr/bin/env bash
# Set up and launch a real SGLang server on the CPU for gyre's engine contract suite.
# Not run in CI (about 11 GB and 4 minutes to install). See docs/engines.md.
#
#   tools/sglang_setup.sh [WORKDIR]        # default WORKDIR: .gyre/sglang
#
# Then, in another shell:
#   GYRE_SGLANG_URL=http://127.0.0.1:30000 GYRE_SGLANG_MODEL_DIR=WORKDIR/model \
#     .venv/bin/python -m pytest tests/integration/proxy -m sglang
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:-$ROOT/.gyre/sglang}"
PORT="${GYRE_SGLANG_PORT:-30000}"
CONTEXT="${GYRE_SGLANG_CONTEXT_LENGTH:-2048}"
SGLANG_VERSION="0.5.23"
mkdir -p "$WORK"

# 1. A separate virtual environment: sglang pins its own torch and CUDA wheels.
if [[ ! -x "$WORK/venv/bin/python" ]]; then
    python3.11 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install --upgrade pip
    "$WORK/venv/bin/pip" install "sglang==$SGLANG_VERSION"
fi

# 2. A stub libcuda.so.1: sglang resolves cuPointerGetAttribute at import even on the CPU.
if [[ ! -f "$WORK/stubcuda/libcuda.so.1" ]]; then
    mkdir -p "$WORK/stubcuda"
    cat > "$WORK/stubcuda/stub.c" <<'C'
int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) { return 1; }
C
    gcc -shared -fPIC -o "$WORK/stubcuda/libcuda.so.1" "$WORK/stubcuda/stub.c"
fi

# 3. The tiny Qwen3 model gyre's reference engine builds by default, written to a folder
#    (weights from seed 0), so both engines serve identical weights.
if [[ ! -f "$WORK/model/config.json" ]]; then
    "$ROOT/.venv/bin/python" - "$WORK/model" <<'PY'
import sys
from pathlib import Path

from gyre_proxy.refengine import ModelSource, load_model, save_model_dir

loaded = load_model(ModelSource(seed=0))
save_model_dir(loaded.model, Path(sys.argv[1]))
print("model written to", sys.argv[1])
PY
fi

# 4. Launch on the CPU. SGLANG_RETURN_ORIGINAL_LOGPROB is left unset (SGLang's default),
#    which is also the reference engine's default.
echo "SGLang on http://127.0.0.1:$PORT (model $WORK/model); Ctrl-C to stop"
export LD_LIBRARY_PATH="$WORK/stubcuda:${LD_LIBRARY_PATH:-}"
export SGLANG_USE_CPU_ENGINE=1
exec "$WORK/venv/bin/python" -m sglang.launch_server \
    --model-path "$WORK/model" \
    --skip-tokenizer-init \
    --device cpu \
    --host 127.0.0.1 --port "$PORT" \
    --context-length "$CONTEXT" \
    --max-total-tokens 8192 \
    --skip-server-warmup
