"""``gyre proxy serve`` and ``gyre executions new``: the harness-facing proxy."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from prometheus_client import multiprocess

from gyre_proxy import (
    ChatFormatError,
    ProxyConfig,
    ProxyService,
    WorkerSync,
    WorkerTable,
    issue_key,
    reuseport_socket,
)
from gyre_proxy.engines import advertised_url, needs_advertise_host
from gyre_proxy.harness import CODEX_KEY_ENV, provider_config
from gyre_store import (
    EventLog,
    EventMetadata,
    NewEvent,
    ProxyRegistered,
    SignalStop,
    StoreUnavailable,
    StreamId,
)
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, console, open_store

# prometheus_client's multiprocess mode reads this variable when it is imported.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def register(subparsers: Any) -> None:
    proxy = subparsers.add_parser("proxy", help="the harness-facing proxy")
    sub = proxy.add_subparsers(dest="proxy_command", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="serve the Anthropic and OpenAI APIs over SGLang-API engines")
    add_store_arguments(serve)
    serve.add_argument(
        "--engine",
        action="append",
        default=None,
        help="NAME=URL of an engine speaking SGLang's API (repeatable; env GYRE_PROXY_ENGINES, comma-separated)",
    )
    add_env_argument(serve, "--host", "GYRE_PROXY_HOST", default="127.0.0.1", help="address to bind")
    add_env_argument(serve, "--port", "GYRE_PROXY_PORT", default="8080", type=int, help="port to bind")
    add_env_argument(
        serve,
        "--advertise-host",
        "GYRE_PROXY_ADVERTISE_HOST",
        help="the address other machines reach the proxy at: with --run, the proxy registers "
        "its URL there in the log, for launchers not told --proxy-url (default: --host; "
        "needed with a wildcard --host)",
    )
    add_env_argument(
        serve,
        "--model-name",
        "GYRE_PROXY_MODEL",
        default="gyre-policy",
        help="model name reported to clients",
    )
    add_env_argument(
        serve,
        "--model",
        "GYRE_PROXY_MODEL_DIR",
        default=None,
        help="a save_pretrained checkpoint folder: its tokenizer.json and chat template render "
        "every request (default: the bundled Qwen3.6 vocabulary and gyre's Qwen3 template)",
    )
    add_env_argument(
        serve,
        "--harness",
        "GYRE_PROXY_HARNESS",
        default="claude-code",
        help="harness plug-in: builtin, claude-code, codex or generic",
    )
    add_env_argument(
        serve,
        "--run",
        "GYRE_RUN_ID",
        help="also serve the engines this live run registers in the log",
    )
    add_env_argument(
        serve,
        "--gc-threshold",
        "GYRE_PROXY_GC_THRESHOLD",
        default="50000",
        type=int,
        help="after start-up, freeze the heap and collect the youngest generation every N "
        "allocations (0: leave Python's collector as it is)",
    )
    add_env_argument(
        serve,
        "--context-limit",
        "GYRE_PROXY_CONTEXT_LIMIT",
        default="131072",
        type=int,
        help="largest input in tokens",
    )
    add_env_argument(
        serve,
        "--max-tokens",
        "GYRE_PROXY_MAX_TOKENS",
        default="0",
        type=int,
        help="the most tokens one model call may generate, whatever the harness asks for (0: no cap)",
    )
    add_env_argument(
        serve,
        "--workers",
        "GYRE_PROXY_WORKERS",
        default="1",
        type=int,
        help="processes sharing the port (SO_REUSEPORT); any of them serves any execution",
    )
    add_env_argument(
        serve,
        "--spool-dir",
        "GYRE_PROXY_SPOOL_DIR",
        help="folder where staged records wait on disk until the store takes them; a proxy "
        "started on it sends what an earlier one left (default: proxy-spool/port-PORT under "
        "--data-dir; with --workers, one subfolder per worker)",
    )
    add_env_argument(
        serve,
        "--answers-log",
        "GYRE_PROXY_ANSWERS_LOG",
        help="append a JSON line per model-call record staged (execution and request id) to "
        "this file, to hold the store's records against (default: none)",
    )
    add_env_argument(
        serve,
        "--max-in-flight",
        "GYRE_PROXY_MAX_IN_FLIGHT",
        default="0",
        type=int,
        help="the most model calls each worker takes at once; past it a call is refused (Anthropic "
        "529 overloaded_error, OpenAI 429) with a retry-after (0: no bound)",
    )
    add_env_argument(
        serve,
        "--retry-after",
        "GYRE_PROXY_RETRY_AFTER",
        default="1",
        type=float,
        help="seconds a refused call is told to wait (its retry-after header)",
    )
    add_env_argument(
        serve,
        "--sequence-cache-mb",
        "GYRE_PROXY_SEQUENCE_CACHE_MB",
        default="1024",
        type=int,
        help="memory each worker keeps for the full token sequences of recent records, so a "
        "turn slices its prefix from memory; one past it is rebuilt from the log (default 1024)",
    )
    add_env_argument(
        serve,
        "--chain-cache-mb",
        "GYRE_PROXY_CHAIN_CACHE_MB",
        default="1024",
        type=int,
        help="text of recent requests' messages each worker keeps, in MiB counted as characters, "
        "so a request hashes only the messages it adds; past it an execution's next request is "
        "hashed whole (default 1024)",
    )
    # Set by `--workers N` on the processes it starts.
    serve.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--worker-table", help=argparse.SUPPRESS)
    serve.set_defaults(func=run_serve)

    executions = subparsers.add_parser("executions", help="register executions for harnesses")
    esub = executions.add_subparsers(dest="executions_command", metavar="ACTION", required=True)
    new = esub.add_parser("new", help="register an execution and print its API key and base URL")
    add_store_arguments(new)
    add_env_argument(
        new, "--harness", "GYRE_HARNESS", default="claude-code", help="claude-code, codex or openai"
    )
    add_env_argument(new, "--run-id", "GYRE_RUN_ID", default="default", help="the run it belongs to")
    add_env_argument(new, "--execution-id", "GYRE_EXECUTION_ID", help="default: a new id")
    add_env_argument(
        new, "--proxy-url", "GYRE_PROXY_URL", default="http://127.0.0.1:8080", help="where the proxy listens"
    )
    new.add_argument("--json", action="store_true", help="machine-readable output")
    new.set_defaults(func=run_new)


def _engines(args: argparse.Namespace) -> list[tuple[str, str]]:
    import os

    specs = args.engine or [s for s in os.environ.get("GYRE_PROXY_ENGINES", "").split(",") if s]
    if not specs and not args.run:
        raise SystemExit("gyre proxy serve: give at least one --engine NAME=URL, or --run RUN")
    out = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not url.startswith("http"):
            raise SystemExit(f"gyre proxy serve: --engine must be NAME=http://..., got {spec!r}")
        out.append((name, url))
    return out


def tune_gc(threshold: int) -> None:
    """Keep the collector's full passes short while serving.

    Everything alive after start-up (the vocabulary, the chat template, the app) is frozen out
    of collection, and young objects are collected every `threshold` allocations instead of 700.
    With Python's defaults a full collection over that heap stalled one request in a hundred by
    about 100 ms under harness load (benchmarks/bench_proxy.py: p99 +106 ms; +10 to +14 ms
    with this).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold, 20, 10)


def run_serve(args: argparse.Namespace) -> int:
    if args.worker_index is None and args.workers > 1:
        return supervise(args)
    if args.workers < 1:
        raise SystemExit("gyre proxy serve: --workers must be at least 1")
    if min(args.max_in_flight, args.retry_after, args.sequence_cache_mb, args.chain_cache_mb) < 0:
        raise SystemExit(
            "gyre proxy serve: --max-in-flight, --retry-after, --sequence-cache-mb and --chain-cache-mb "
            "must not be negative"
        )
    if args.run and needs_advertise_host(args.host, args.advertise_host):
        raise SystemExit(
            f"gyre proxy serve: --host {args.host!r} listens on every address; --advertise-host "
            "must say the one the run's launchers reach it at"
        )
    spool = (
        Path(args.spool_dir) if args.spool_dir else Path(args.data_dir) / "proxy-spool" / f"port-{args.port}"
    )
    if args.worker_index is not None:
        spool = spool / f"worker-{args.worker_index}"
    config = ProxyConfig(
        engines=_engines(args),
        model_name=args.model_name,
        model_dir=Path(args.model) if args.model else None,
        harness=args.harness,
        context_limit=args.context_limit,
        max_tokens=_max_tokens(args.max_tokens),
        host=args.host,
        port=args.port,
        run_id=args.run,
        spool_dir=spool,
        answers_log=Path(args.answers_log) if args.answers_log else None,
        max_in_flight=args.max_in_flight,
        retry_after_s=args.retry_after,
        sequence_cache_bytes=args.sequence_cache_mb << 20,
        chain_cache_chars=args.chain_cache_mb << 20,
        # Set by `--workers N` for its workers: /metrics then sums every worker's values.
        metrics_dir=Path(os.environ[METRICS_DIR_ENV])
        if args.worker_index is not None and os.environ.get(METRICS_DIR_ENV)
        else None,
    )
    # SIGTERM (how a process manager, `gyre run` or a test stops it) ends the serving loop like
    # Ctrl-C does, so the spooled records are written; its default action would drop them.
    signals = SignalStop([signal.SIGTERM])
    stop = signals.install()
    sock = sync = worker = table = None
    if args.worker_index is not None:
        table = WorkerTable(Path(args.worker_table), workers=args.workers, index=args.worker_index)
        table.recover()
        sync = WorkerSync(table)
        sock = reuseport_socket(args.host, args.port)
        worker = f"worker-{args.worker_index}"
    try:
        with open_store(args) as opened:
            # A spool folder keeps its records for the database they were staged for.
            config = dataclasses.replace(config, spool_store=opened.services.database_url.split("@")[-1])
            try:
                proxy = ProxyService(opened.log, config, sock=sock, sync=sync, worker=worker)
            except ChatFormatError as exc:  # the checkpoint's tokenizer or template: one line
                raise SystemExit(f"gyre proxy serve: {exc}") from None
            with proxy as service:
                if args.gc_threshold > 0:
                    tune_gc(args.gc_threshold)
                follower = threading.Thread(target=service.follow, args=(stop,), daemon=True)
                follower.start()
                if args.run and args.worker_index in (None, 0):  # one registration per proxy
                    url = advertised_url(service.base_url, args.advertise_host)
                    # Beside the serving: a proxy started while the database is down serves
                    # (and spools) at once, and registers once the database answers.
                    threading.Thread(
                        target=_register_when_up, args=(opened.log, args.run, url, stop), daemon=True
                    ).start()
                engines = ", ".join(n for n, _ in config.engines)
                who = "" if worker is None else f" ({worker}, pid {os.getpid()})"
                console.print(
                    f"gyre proxy on {service.base_url}{who} -> {engines}; records spooled in {spool}"
                )
                parent = os.getppid()
                try:
                    # A worker also stops when the process that started it is gone.
                    while not stop.wait(1.0):
                        if worker is not None and os.getppid() != parent:
                            break
                except KeyboardInterrupt:
                    pass
                stop.set()
                follower.join(timeout=5)  # it reads the log, which closes next
                # Leaving the block writes what the spool still holds before the store closes.
    finally:
        signals.restore()
        if table is not None:
            table.close()
    return 0


def register_proxy(log: EventLog, run_id: str, url: str) -> None:
    """Record that run ``run_id``'s proxy answers at ``url`` (each start anew)."""
    event = ProxyRegistered(run_id=run_id, url=url)
    log.append(
        [
            NewEvent(
                event, f"proxy:{run_id}:{url}:{uuid.uuid4().hex[:12]}", metadata=EventMetadata(run_id=run_id)
            )
        ]
    )


def _register_when_up(log: EventLog, run_id: str, url: str, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            register_proxy(log, run_id, url)
            return
        except StoreUnavailable as exc:
            console.print(f"gyre proxy: not registered yet ({exc}); trying again")
            stop.wait(2.0)


def registered_proxy(log: EventLog, run_id: str) -> str | None:
    """The URL run ``run_id``'s proxy registered last, or None before it has."""
    urls = [
        r.event.url
        for r in log.read_stream(StreamId("proxy", run_id))
        if isinstance(r.event, ProxyRegistered)
    ]
    return urls[-1] if urls else None


def supervise(args: argparse.Namespace) -> int:
    """`--workers N`: start N worker processes on the port and keep them running.

    Each worker opens its own SO_REUSEPORT socket on the port, so the kernel spreads new
    connections over them; they share a table of counters (``gyre_proxy.WorkerTable``) in a
    file that lives as long as this process. A worker that dies is started again; SIGINT or
    SIGTERM stops them all (each writes its spooled records first).
    """
    if args.port == 0:
        raise SystemExit("gyre proxy serve: --workers needs a fixed --port")
    shm = Path("/dev/shm")
    fd, name = tempfile.mkstemp(prefix="gyre-proxy-workers-", dir=shm if shm.is_dir() else None)
    os.close(fd)
    table = Path(name)
    WorkerTable.create(table, workers=args.workers)
    # The workers' metrics, summed by whichever worker answers a scrape (service/metrics.py).
    metrics_dir = Path(tempfile.mkdtemp(prefix="gyre-proxy-metrics-", dir=shm if shm.is_dir() else None))
    env = {**os.environ, METRICS_DIR_ENV: str(metrics_dir)}
    signals = SignalStop()  # SIGINT or SIGTERM
    stopping = signals.install()

    def start(index: int) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "gyre_tools.cli", *sys.argv[1:]]
        # A session of its own: a terminal's Ctrl-C reaches this process, which stops them in order.
        return subprocess.Popen(
            [*argv, "--worker-index", str(index), "--worker-table", str(table)],
            start_new_session=True,
            env=env,
        )

    workers = [start(i) for i in range(args.workers)]
    console.print(
        f"gyre proxy: {args.workers} workers on http://{args.host}:{args.port} (pids {', '.join(str(w.pid) for w in workers)})"
    )
    try:
        while not stopping.wait(0.5):
            for i, worker in enumerate(workers):
                if worker.poll() is not None and not stopping.is_set():
                    console.print(
                        f"gyre proxy: worker {i} (pid {worker.pid}) exited with {worker.returncode}; starting it again"
                    )
                    # Its requests in flight are gone; its counters stay in the sums.
                    multiprocess.mark_process_dead(worker.pid, str(metrics_dir))
                    time.sleep(1.0)
                    workers[i] = start(i)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGINT)
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        signals.restore()
        table.unlink(missing_ok=True)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def run_new(args: argparse.Namespace) -> int:
    execution_id = args.execution_id or f"{args.run_id}-{uuid.uuid4().hex[:8]}"
    with open_store(args) as opened:
        key = issue_key(opened.log, execution_id=execution_id, run_id=args.run_id, harness=args.harness)
    openai_style = args.harness in ("openai", "codex")
    base = args.proxy_url.rstrip("/") + "/v1" if openai_style else args.proxy_url
    found: dict[str, str] = {
        "execution_id": execution_id,
        "api_key": key,
        "base_url": base,
        "harness": args.harness,
    }
    if args.harness == "codex":
        found["config_toml"] = provider_config(args.proxy_url)
    if args.json:
        print(json.dumps(found))
    elif args.harness == "codex":
        # The key goes in the environment variable the provider block names, never in the file.
        console.print(
            f"execution {execution_id}\n  base URL {base}\n  {CODEX_KEY_ENV}={key}\n"
            f"add to $CODEX_HOME/config.toml:\n\n{found['config_toml']}",
            markup=False,
            highlight=False,
        )
    else:
        env = "ANTHROPIC" if not openai_style else "OPENAI"
        console.print(f"execution {execution_id}\n  {env}_BASE_URL={base}\n  {env}_API_KEY={key}")
    return 0


def _max_tokens(value: int) -> int | None:
    """``--max-tokens``: 0 is no cap; a negative number is refused."""
    if value < 0:
        raise SystemExit(f"--max-tokens must be 0 (no cap) or positive, got {value}")
    return value or None
