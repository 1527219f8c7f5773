"""gyre's servers as a user starts them: `gyre engine serve` and `gyre proxy serve` processes,
ready once their /health answers, stopped on the way out; and reading what they stored.
The harness tests share them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from gyre_proxy.hosting import free_port
from gyre_store import InMemoryProjectionStore, PostgresEventLog, StoreConfig, catch_up
from gyre_store.catalog import ModelCallRecorded
from gyre_store.log import StreamId
from gyre_store.trees import TreeProjection, TreeView
from gyre_train.sandbox import BASE_IMAGE, PodmanSandbox, bwrap_missing, podman_missing
from gyre_train.sandbox.users import POOL_FIRST, POOL_SIZE
from tests.acceptance.conftest import ROOT

# who a confined harness runs as: started by root, a user leased from the pool; else gyre's own
SANDBOX_UIDS = (
    range(POOL_FIRST, POOL_FIRST + POOL_SIZE) if os.geteuid() == 0 else range(os.geteuid(), os.geteuid() + 1)
)


@contextmanager
def gyre_process(
    args: list[str], log: Path, env: dict[str, str] | None = None, port: int | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``gyre ARGS --port P`` (a server command) in a subprocess, ready once /health answers;
    yields its base URL and the process (to kill it on purpose), and stops it on the way out."""
    port = port or free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    base.update(env or {})
    if args[:2] == ["proxy", "serve"] and "--spool-dir" not in args:
        # Beside the test's log, not under the user's ~/.gyre, where it would outlive the test.
        base.setdefault("GYRE_PROXY_SPOOL_DIR", str(log.parent / f"proxy-spool-{port}"))
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gyre_tools.cli", *args, "--port", str(port)],
            cwd=ROOT, env=base, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, f"gyre {args[0]} exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"gyre {args[0]} never answered: {log.read_text()[-2000:]}"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(20)


@contextmanager
def gyre_server(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``gyre ARGS --port P`` (a server command) in a subprocess; yields its base URL."""
    with gyre_process(args, log, env) as (url, _):
        yield url


@contextmanager
def engine_and_proxy(database_url: str, script: Path, harness: str, logs: Path) -> Iterator[str]:
    """`gyre engine serve` with a scripted policy over the Qwen vocabulary and `gyre proxy serve`
    for ``harness`` in front of it, on ``database_url``; yields the proxy's URL."""
    engine_args = [
        "engine",
        "serve",
        "--tokenizer",
        "qwen",
        "--max-context",
        "65536",
        "--script",
        str(script),
    ]
    with gyre_server(engine_args, logs / "engine.log") as engine:
        proxy_args = ["proxy", "serve", "--engine", f"engine-0={engine}", "--harness", harness,
                      "--context-limit", "65536"]  # fmt: skip
        with gyre_server(proxy_args, logs / "proxy.log", {"GYRE_DATABASE_URL": database_url}) as proxy:
            yield proxy


def settled_records(database_url: str, execution_id: str) -> list[ModelCallRecorded]:
    """The execution's records once no new one has arrived for 2 s (the proxy writes off the path)."""
    seen, since = -1, time.monotonic()
    deadline = since + 60
    with PostgresEventLog(StoreConfig(database_url)) as log:
        while True:
            calls = [
                e.event
                for e in log.read_stream(StreamId("calls", execution_id))
                if isinstance(e.event, ModelCallRecorded)
            ]
            if len(calls) != seen:
                seen, since = len(calls), time.monotonic()
            elif time.monotonic() - since > 2 or time.monotonic() > deadline:
                return calls
            time.sleep(0.2)


def tree(database_url: str, execution_id: str) -> TreeView:
    projection = TreeProjection()
    with PostgresEventLog(StoreConfig(database_url)) as log:
        store = InMemoryProjectionStore({t.name: t for t in projection.tables}, log)
        catch_up(log, store, projection)
        return TreeView.load(store, execution_id)


def live_run_env(database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment a live run's `gyre run` needs: its database, Redis and data folder."""
    return {
        "GYRE_DATABASE_URL": database_url,
        "GYRE_REDIS_URL": os.environ.get("GYRE_TEST_REDIS", "redis://127.0.0.1:6379/0"),
        "GYRE_DATA_DIR": str(data_dir),
        **extra,
    }


def gyre_run(
    folder: Path, env: dict[str, str], *args: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """`gyre run --config FOLDER/run.toml --json FOLDER/run.json --quiet [ARGS]`, asserted to
    succeed; a failure shows the end of its output and of every process log of the run."""
    from tests.acceptance.conftest import gyre

    out = gyre(
        "run", "--config", str(folder / "run.toml"), "--json", str(folder / "run.json"), "--quiet", *args,
        env=env, timeout=timeout,
    )  # fmt: skip
    logs = "".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}\n" for p in sorted(folder.rglob("*.log"))
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + logs
    return out


def run_events(database_url: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """Every event of run ``run_id`` and of its side runs (``<run>~...``), in log order, as
    (event type, body)."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT event_type, body FROM gyre_events WHERE body->>'run_id' LIKE %s ORDER BY position",
            (run_id + "%",),
        ).fetchall()
    return [(str(t), dict(b)) for t, b in rows]


def sandbox_run_folder(prefix: str, config: str) -> Path:
    """A run folder holding ``run.toml``, outside pytest's private tmp_path: a sandbox's
    unprivileged user must reach the run's folders."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    (folder / "run.toml").write_text(config)
    return folder


def sandbox_missing(kind: str) -> str | None:
    """Why a live run cannot use the sandbox ``kind`` (bwrap or podman) here; None when it can."""
    if kind == "bwrap":
        return bwrap_missing()
    missing = podman_missing()
    if missing is None and not PodmanSandbox().has_image(BASE_IMAGE):
        missing = f"the base image {BASE_IMAGE} is missing: run tools/podman_setup.sh"
    return missing
