#!/usr/bin/env bash
# A real SGLang server on the CPU for gyre's engine tests. tools/run-tests.sh uses it in CI;
# see docs/engines.md.
#
#   tools/sglang_setup.sh                   # build (if needed), write the model, serve on :30000
#   tools/sglang_setup.sh build             # only build SGLang's environment (if needed)
#   tools/sglang_setup.sh model DIR         # write gyre's tiny Qwen3 (seed 0) to DIR
#   tools/sglang_setup.sh serve DIR PORT [ARGS]  # serve the model in DIR on 127.0.0.1:PORT
#                                           # (ARGS: more launch_server options; a repeated
#                                           # option overrides the default above it)
#   tools/sglang_setup.sh python            # print the environment's python if it is built,
#                                           # else exit 1 saying how to build it (gyre run's check)
#   tools/sglang_setup.sh start STATE       # build, model, serve on a free port, wait for
#                                           # health; reports through files in STATE (below)
#
# SGLang lives in its own virtualenv (it pins its own torch and CUDA wheels: about 11 GB),
# built once per machine outside any checkout, in $GYRE_SGLANG_HOME (default
# ${XDG_CACHE_HOME:-~/.cache}/gyre/sglang-<version>). A stamp there holds the hash of the
# version, the interpreter and the recipe below; only a change of that hash rebuilds it.
#
# By hand, then in another shell:
#   GYRE_SGLANG_URL=http://127.0.0.1:30000 GYRE_SGLANG_MODEL_DIR=.gyre/sglang/model \
#     .venv/bin/python -m pytest tests/integration/proxy -m sglang
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SGLANG_VERSION="0.5.23"
SGLANG_HOME="${GYRE_SGLANG_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/gyre/sglang-$SGLANG_VERSION}"
PYTHON="$(command -v python3.11 || command -v python3)"

# The recipe: everything that lands in the cached folder. Its code (not its comments) is part
# of the stamp, so changing it rebuilds the environment on every machine.
sglang_recipe() {
    local home="$1"
    "$PYTHON" -m venv "$home/venv"
    # --no-cache-dir: the wheels are used once; keeping them would double the 11 GB on disk.
    "$home/venv/bin/python" -m pip install -q --no-cache-dir --upgrade pip
    "$home/venv/bin/python" -m pip install -q --no-cache-dir "sglang==$SGLANG_VERSION"
    # SGLang resolves cuPointerGetAttribute from libcuda.so.1 at import, even on the CPU.
    mkdir -p "$home/stubcuda"
    printf '%s\n' 'int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) { return 1; }' \
        >"$home/stubcuda/stub.c"
    gcc -shared -fPIC -o "$home/stubcuda/libcuda.so.1" "$home/stubcuda/stub.c"
}

# The stamp a complete build of this recipe leaves.
wanted_stamp() {
    { echo "$SGLANG_VERSION"; "$PYTHON" --version; declare -f sglang_recipe; } | sha256sum | cut -d' ' -f1
}

build() {
    local want
    want="$(wanted_stamp)"
    mkdir -p "$(dirname "$SGLANG_HOME")"
    # The lock lets several checkouts build at once: the second finds the first one's build.
    exec 9>"$SGLANG_HOME.lock"
    flock 9
    if [[ -f "$SGLANG_HOME/.gyre-stamp" && "$(cat "$SGLANG_HOME/.gyre-stamp")" == "$want" ]]; then
        return 0
    fi
    # A half-built folder (venv, no stamp) is ours to replace; anything else is not.
    if [[ -d "$SGLANG_HOME" && ! -f "$SGLANG_HOME/.gyre-stamp" && ! -d "$SGLANG_HOME/venv" ]] \
        && [[ -n "$(ls -A "$SGLANG_HOME")" ]]; then
        echo "refusing to replace $SGLANG_HOME: it is not a folder this script built" >&2
        return 1
    fi
    echo "building SGLang $SGLANG_VERSION's environment in $SGLANG_HOME (about 11 GB, minutes)" >&2
    rm -rf "$SGLANG_HOME"
    mkdir -p "$SGLANG_HOME"
    sglang_recipe "$SGLANG_HOME"
    # Written last: a build that stopped half-way is redone from scratch next time.
    echo "$want" >"$SGLANG_HOME/.gyre-stamp"
    exec 9>&-
}

# The reference engine's default tiny Qwen3 (weights from seed 0), written by gyre's own
# .venv, so SGLang and the reference engine serve identical weights.
model() {
    "$ROOT/.venv/bin/python" - "$1" <<'PY'
import sys
from pathlib import Path

from gyre_proxy.engines.refengine import ModelSource, load_model, save_model_dir

loaded = load_model(ModelSource(seed=0))
save_model_dir(loaded.model, Path(sys.argv[1]))
PY
}

# SGLANG_RETURN_ORIGINAL_LOGPROB is left unset (SGLang's default), which is also the
# reference engine's default. --max-total-tokens bounds the KV pool, which SGLang would
# otherwise size from the machine's memory. --sleep-on-idle: an idle scheduler otherwise
# spins, taking a whole core (seen: 30 s of CPU in 30 s) from the tests that run beside it.
serve() {
    export LD_LIBRARY_PATH="$SGLANG_HOME/stubcuda:${LD_LIBRARY_PATH:-}"
    export SGLANG_USE_CPU_ENGINE=1
    exec "$SGLANG_HOME/venv/bin/python" -m sglang.launch_server \
        --model-path "$1" \
        --skip-tokenizer-init \
        --device cpu \
        --host 127.0.0.1 --port "$2" \
        --context-length "${GYRE_SGLANG_CONTEXT_LENGTH:-2048}" \
        --max-total-tokens 8192 \
        --sleep-on-idle \
        --skip-server-warmup \
        "${@:3}"
}

# gyre run's check before it starts SGLang engines: the environment's python, or why not.
python_path() {
    if [[ -f "$SGLANG_HOME/.gyre-stamp" && "$(cat "$SGLANG_HOME/.gyre-stamp")" == "$(wanted_stamp)" \
        && -x "$SGLANG_HOME/venv/bin/python" ]]; then
        echo "$SGLANG_HOME/venv/bin/python"
        return 0
    fi
    echo "SGLang $SGLANG_VERSION's environment is not built in $SGLANG_HOME: run \`bash $ROOT/tools/sglang_setup.sh build\` (about 11 GB, minutes; GYRE_SGLANG_HOME puts it elsewhere)" >&2
    return 1
}

# For run-tests.sh, which runs this in the background in a process group of its own and
# ends the group when the tests are done. STATE receives: build.log, server.log, model/,
# `timings` (a line per phase: NAME SECONDS), then `url` once the server is healthy, or
# `error` (the reason, for the tests to fail with). The server runs until the group ends.
start() {
    # Globals, not locals: the EXIT trap reads them after start has returned.
    state="$1"
    why="building SGLang $SGLANG_VERSION's environment in $SGLANG_HOME failed (log: $state/build.log)"
    trap '[[ -f "$state/url" ]] || report_error' EXIT
    local t port server deadline
    t=$SECONDS
    build >"$state/build.log" 2>&1
    echo "sglang-build $((SECONDS - t))" >>"$state/timings"
    why="writing the tiny model to $state/model failed (log: $state/build.log)"
    model "$state/model" >>"$state/build.log" 2>&1
    t=$SECONDS
    port="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    why="SGLang did not become healthy on 127.0.0.1:$port (log: $state/server.log)"
    serve "$state/model" "$port" >"$state/server.log" 2>&1 &
    server=$!
    deadline=$((SECONDS + ${GYRE_SGLANG_START_TIMEOUT:-600}))
    until curl -sf -o /dev/null "http://127.0.0.1:$port/health"; do
        if ! kill -0 "$server" 2>/dev/null; then
            why="SGLang exited while starting (log: $state/server.log)"
            return 1
        fi
        if ((SECONDS > deadline)); then
            why="SGLang was not healthy after ${GYRE_SGLANG_START_TIMEOUT:-600} s (log: $state/server.log)"
            return 1
        fi
        sleep 1
    done
    echo "sglang-server-start $((SECONDS - t))" >>"$state/timings"
    echo "http://127.0.0.1:$port" >"$state/url.tmp"
    mv "$state/url.tmp" "$state/url"
    wait "$server"
}

# The reason and the end of the newest log (less pip's warnings about local indexes).
report_error() {
    local log
    log="$state/build.log"
    [[ -f "$state/server.log" ]] && log="$state/server.log"
    {
        echo "$why"
        if [[ -n "$log" ]]; then
            grep -v "is ignored: it is neither a file nor a directory" "$log" | tail -n 15 || true
        fi
    } >"$state/error.tmp"
    mv "$state/error.tmp" "$state/error"
}

case "${1:-}" in
    build) build ;;
    model) model "$2" ;;
    serve) shift; serve "$@" ;;
    python) python_path ;;
    start) start "$2" ;;
    *)
        work="${1:-$ROOT/.gyre/sglang}"
        build
        [[ -f "$work/model/config.json" ]] || model "$work/model"
        echo "SGLang on http://127.0.0.1:${GYRE_SGLANG_PORT:-30000} (model $work/model); Ctrl-C to stop"
        serve "$work/model" "${GYRE_SGLANG_PORT:-30000}"
        ;;
esac
