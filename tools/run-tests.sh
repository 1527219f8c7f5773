#!/usr/bin/env bash
# The whole test suite: `bash tools/run-tests.sh [pytest options]`.
# Sets up .venv, finds PostgreSQL and Redis on 127.0.0.1 (starting the machine's if they
# are installed but down, else embedded ones from pip packages), makes Mooncake Transfer
# Engine importable (the OS's libibverbs1), starts a real SGLang server on the CPU in the
# background (its environment built once per machine, see tools/sglang_setup.sh), lints and
# type-checks meanwhile, tests, stops the server, and prints how long each phase took.
#
# A real server, harness or package that cannot be set up makes its tests fail with the reason.
# To skip them instead, and say so: GYRE_TEST_SKIP_SGLANG=1, GYRE_TEST_SKIP_MOONCAKE=1,
# GYRE_TEST_SKIP_HARNESSES=1 (or GYRE_TEST_SKIP_CLAUDE_CODE=1, GYRE_TEST_SKIP_CODEX=1),
# GYRE_TEST_SKIP_MEGATRON=1, GYRE_TEST_SKIP_BWRAP=1 (bubblewrap, for the sandbox tests),
# GYRE_TEST_SKIP_PODMAN=1 (rootful podman, for the podman and docker sandbox tests),
# GYRE_TEST_SKIP_BROWSER=1 (Debian's chromium and chromium-driver, for gyre ui's browser test),
# GYRE_TEST_SKIP_POSTGRES_BINARIES=1 (the private clusters that the
# database-outage tests stop and start need initdb and pg_ctl). A server of your
# own is used as it is when GYRE_SGLANG_URL and GYRE_SGLANG_MODEL_DIR are set.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

timings=()
embedded_pid=""
sglang_pid=""
sglang_state=""
phase_start=0
phase() { phase_start=$SECONDS; echo "== $1"; }
took() { timings+=("$(printf '%-20s %5d s' "$1" $((SECONDS - phase_start)))"); }
cleanup() {
    if [ -n "$sglang_pid" ]; then
        # The server and everything it spawned share the process group started by setsid.
        kill -TERM -- "-$sglang_pid" 2>/dev/null || true
        for _ in $(seq 20); do kill -0 "$sglang_pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$sglang_pid" 2>/dev/null || true
    fi
    if [ -n "$sglang_state" ] && [ -f "$sglang_state/error" ]; then
        echo "SGLang's logs are kept in $sglang_state" >&2
    elif [ -n "$sglang_state" ]; then
        rm -rf "$sglang_state"
    fi
    [ -n "$embedded_pid" ] && kill "$embedded_pid" 2>/dev/null || true
    if [ "${#timings[@]}" -gt 0 ]; then
        echo "== time per phase"
        printf '   %s\n' "${timings[@]}"
    fi
}
trap cleanup EXIT

phase venv
bash tools/bootstrap.sh
py=.venv/bin/python
took venv

pg_up() { "$py" -c 'import psycopg,sys; psycopg.connect(sys.argv[1], connect_timeout=2).close()' "$1" 2>/dev/null; }
redis_up() { "$py" -c 'import redis,sys; redis.Redis.from_url(sys.argv[1], socket_connect_timeout=2).ping()' "$1" 2>/dev/null; }

export GYRE_TEST_PG="${GYRE_TEST_PG:-postgresql://postgres@127.0.0.1:5432/postgres}"
export GYRE_TEST_REDIS="${GYRE_TEST_REDIS:-redis://127.0.0.1:6379/0}"
if ! pg_up "$GYRE_TEST_PG" && command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    sleep 2
fi
if ! redis_up "$GYRE_TEST_REDIS" && command -v redis-server >/dev/null; then
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
    sleep 1
fi
if ! pg_up "$GYRE_TEST_PG" || ! redis_up "$GYRE_TEST_REDIS"; then
    echo "no PostgreSQL/Redis on 127.0.0.1: starting embedded servers for the tests" >&2
    env_file="$(mktemp)"
    "$py" -m tests.embedded_services "$env_file" &
    embedded_pid=$!
    for _ in $(seq 120); do [ -s "$env_file" ] && break; sleep 0.5; done
    # shellcheck disable=SC1090
    source "$env_file"
fi

# SGLang first, in the background: building its environment (minutes, once per machine)
# and starting the server (about 30 s) overlap with ruff and mypy.
if [ -n "${GYRE_SGLANG_URL:-}" ] && [ -n "${GYRE_SGLANG_MODEL_DIR:-}" ]; then
    echo "== sglang: using the server at $GYRE_SGLANG_URL"
elif [ "${GYRE_TEST_SKIP_SGLANG:-}" = 1 ]; then
    echo "!! SGLANG TESTS WILL BE SKIPPED (GYRE_TEST_SKIP_SGLANG=1)" >&2
else
    echo "== sglang: building (if needed) and starting a server in the background"
    sglang_state="$(mktemp -d)"
    setsid bash tools/sglang_setup.sh start "$sglang_state" </dev/null &
    sglang_pid=$!
fi

phase mooncake
if [ "${GYRE_TEST_SKIP_MOONCAKE:-}" = 1 ]; then
    echo "!! MOONCAKE TESTS WILL BE SKIPPED (GYRE_TEST_SKIP_MOONCAKE=1)" >&2
elif ! "$py" -c 'import mooncake.engine' 2>/dev/null; then
    # The non-CUDA wheel links against libibverbs.so.1, which only the OS provides.
    tried="not root with apt-get here: install Debian's libibverbs1"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing libibverbs1 (Mooncake Transfer Engine needs it)"
        export DEBIAN_FRONTEND=noninteractive
        if apt-get install -y -qq libibverbs1 >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq libibverbs1 >/dev/null; }; then
            tried="libibverbs1 is installed"
        else
            tried="apt-get install libibverbs1 failed"
        fi
    fi
    if ! why="$("$py" -c 'import mooncake.engine' 2>&1)"; then
        export GYRE_TEST_MOONCAKE_ERROR="Mooncake Transfer Engine does not import (${why##*$'\n'}); $tried"
        echo "!! $GYRE_TEST_MOONCAKE_ERROR: its tests will fail (GYRE_TEST_SKIP_MOONCAKE=1 skips them)" >&2
    fi
fi
took mooncake

# bubblewrap, the `bwrap` sandbox of the task tests (Debian's bubblewrap).
phase bubblewrap
if [ "${GYRE_TEST_SKIP_BWRAP:-}" = 1 ]; then
    echo "!! BWRAP TESTS WILL BE SKIPPED (GYRE_TEST_SKIP_BWRAP=1)" >&2
elif ! command -v bwrap >/dev/null; then
    tried="not root with apt-get here: install Debian's bubblewrap"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing bubblewrap (the bwrap sandbox's tests need it)"
        export DEBIAN_FRONTEND=noninteractive
        if apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }; then
            tried="bubblewrap is installed"
        else
            tried="apt-get install bubblewrap failed"
        fi
    fi
    if ! command -v bwrap >/dev/null; then
        export GYRE_TEST_BWRAP_ERROR="bwrap is not on PATH; $tried"
        echo "!! $GYRE_TEST_BWRAP_ERROR: its tests will fail (GYRE_TEST_SKIP_BWRAP=1 skips them)" >&2
    fi
fi
took bubblewrap

# chromium and its WebDriver, the headless browser of gyre ui's test (Debian's chromium and
# chromium-driver).
phase browser
if [ "${GYRE_TEST_SKIP_BROWSER:-}" = 1 ]; then
    echo "!! BROWSER TESTS WILL BE SKIPPED (GYRE_TEST_SKIP_BROWSER=1)" >&2
elif ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    tried="not root with apt-get here: install Debian's chromium and chromium-driver"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing chromium and chromium-driver (gyre ui's browser test needs them)"
        export DEBIAN_FRONTEND=noninteractive
        if apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }; then
            tried="chromium and chromium-driver are installed"
        else
            tried="apt-get install chromium chromium-driver failed"
        fi
    fi
    if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
        export GYRE_TEST_BROWSER_ERROR="chromium or chromedriver is not on PATH; $tried"
        echo "!! $GYRE_TEST_BROWSER_ERROR: its test will fail (GYRE_TEST_SKIP_BROWSER=1 skips it)" >&2
    fi
fi
took browser

# rootful podman and its base image, the `podman` and `docker` sandboxes' tests (Debian's podman
# and runc; tools/podman_setup.sh builds localhost/gyre-base:latest from the host's /usr once).
phase podman
if [ "${GYRE_TEST_SKIP_PODMAN:-}" = 1 ]; then
    echo "!! PODMAN TESTS WILL BE SKIPPED (GYRE_TEST_SKIP_PODMAN=1)" >&2
elif [ "$(id -u)" = 0 ]; then
    if ! why="$(bash tools/podman_setup.sh 2>&1)"; then
        echo "!! tools/podman_setup.sh failed: the podman and docker sandbox tests will fail (GYRE_TEST_SKIP_PODMAN=1 skips them): ${why: -300}" >&2
    fi
else
    echo "!! not root: podman's tests need tools/podman_setup.sh run as root first" >&2
fi
took podman

# The harnesses of the end-to-end tests, pinned. One that cannot be installed makes its test
# fail with the reason, unless GYRE_TEST_SKIP_HARNESSES=1 (or GYRE_TEST_SKIP_CLAUDE_CODE=1,
# GYRE_TEST_SKIP_CODEX=1) skips it.
phase harnesses
for harness in claude_code codex; do
    key="$(echo "$harness" | tr '[:lower:]' '[:upper:]')"
    skip_var="GYRE_TEST_SKIP_$key"
    if [ "${GYRE_TEST_SKIP_HARNESSES:-}" = 1 ] || [ "${!skip_var:-}" = 1 ]; then
        echo "!! ${key} TESTS WILL BE SKIPPED (GYRE_TEST_SKIP_HARNESSES=1 or $skip_var=1)" >&2
    elif ! why="$(bash "tools/install_$harness.sh" 2>&1 >/dev/null)"; then
        why="$(printf '%s' "$why" | tail -c 300)"
        export "GYRE_TEST_${key}_ERROR=tools/install_$harness.sh failed (npm unreachable?): $why"
        echo "!! tools/install_$harness.sh failed: its harness test will fail ($skip_var=1 or GYRE_TEST_SKIP_HARNESSES=1 skips it): $why" >&2
    fi
done
took harnesses

phase ruff
.venv/bin/ruff check . && .venv/bin/ruff format --check .
took ruff
phase mypy
.venv/bin/mypy
took mypy
phase import-linter
.venv/bin/lint-imports
took import-linter

if [ -n "$sglang_pid" ]; then
    phase "sglang (waiting)"
    deadline=$((SECONDS + ${GYRE_SGLANG_SETUP_TIMEOUT:-3000}))
    until [ -f "$sglang_state/url" ] || [ -f "$sglang_state/error" ]; do
        if ! kill -0 "$sglang_pid" 2>/dev/null; then
            echo "tools/sglang_setup.sh start ended without a word" >"$sglang_state/error"
        elif [ "$SECONDS" -gt "$deadline" ]; then
            echo "SGLang was not set up after ${GYRE_SGLANG_SETUP_TIMEOUT:-3000} s" >"$sglang_state/error"
        else
            sleep 1
        fi
    done
    took "sglang (waiting)"
    if [ -f "$sglang_state/timings" ]; then
        while read -r name seconds; do
            timings+=("$(printf '%-20s %5d s   (in the background)' "$name" "$seconds")")
        done <"$sglang_state/timings"
    fi
    if [ -f "$sglang_state/url" ]; then
        export GYRE_SGLANG_URL GYRE_SGLANG_MODEL_DIR
        GYRE_SGLANG_URL="$(cat "$sglang_state/url")"
        GYRE_SGLANG_MODEL_DIR="$sglang_state/model"
        echo "SGLang is serving at $GYRE_SGLANG_URL"
    else
        export GYRE_TEST_SGLANG_ERROR
        GYRE_TEST_SGLANG_ERROR="$(cat "$sglang_state/error")"
        echo "!! SGLang is not available: its tests will fail (GYRE_TEST_SKIP_SGLANG=1 skips them):" >&2
        echo "$GYRE_TEST_SGLANG_ERROR" >&2
    fi
fi

phase pytest
set +e
.venv/bin/pytest --durations=25 "$@"
status=$?
set -e
took pytest
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests" >&2
    exit 1
fi
exit "$status"
