#!/usr/bin/env bash
# The whole test suite: `bash tools/run-tests.sh [pytest options]`.
# Sets up .venv, finds PostgreSQL and Redis on 127.0.0.1 (starting the machine's if they
# are installed but down, else embedded ones from pip packages), lints, type-checks, tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tools/bootstrap.sh
py=.venv/bin/python

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
embedded_pid=""
if ! pg_up "$GYRE_TEST_PG" || ! redis_up "$GYRE_TEST_REDIS"; then
    echo "no PostgreSQL/Redis on 127.0.0.1: starting embedded servers for the tests" >&2
    env_file="$(mktemp)"
    "$py" -m tests.embedded_services "$env_file" &
    embedded_pid=$!
    for _ in $(seq 120); do [ -s "$env_file" ] && break; sleep 0.5; done
    # shellcheck disable=SC1090
    source "$env_file"
    trap '[ -n "$embedded_pid" ] && kill "$embedded_pid" 2>/dev/null || true' EXIT
fi

echo "== ruff" && .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy" && .venv/bin/mypy
echo "== import-linter" && .venv/bin/lint-imports
echo "== pytest"
set +e
.venv/bin/pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests" >&2
    exit 1
fi
exit "$status"
