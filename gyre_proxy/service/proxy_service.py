"""Assembling a running proxy: the store, engines, routing, the spool, keys and the app.

``ProxyService`` is what ``gyre proxy serve`` runs and what the end-to-end tests start:
one object that owns the engine clients, the record spool and the HTTP app, and closes
them in order (the spool is flushed before the engines go away). ``follow`` keeps it in
step with the log while it serves: the engines a live run registers, the scheduler's
routing changes, and where each execution was placed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from starlette.applications import Starlette

from gyre_proxy.answer import AnswerPipeline, Binding, ExecutionSync, Router
from gyre_proxy.api import build_app, proxy_server
from gyre_proxy.engines import EngineClient, EngineClientConfig, qwen_tokenizer
from gyre_proxy.harness import plugin_for
from gyre_proxy.ingest import (
    ChatFormat,
    CritiqueBook,
    Ingestor,
    Qwen3Template,
    RecordSpool,
    load_chat_format,
)
from gyre_proxy.service.capacity import InFlightLimit
from gyre_proxy.service.evaluations import LogEvaluations
from gyre_proxy.service.keys import StoreKeys
from gyre_proxy.service.metrics import ProxyMetrics, metered
from gyre_store import EngineRegistered, ExecutionRerouted, ExecutionStarted, StoreUnavailable, subscribe
from gyre_store.log import EventLog, RecordedEvent, StreamId
from gyre_store.trees import TrajectoryRecorder

FOLLOWED = ("engine.registered", "engine.routing_changed", "execution.started", "execution.rerouted")
FOLLOW_RETRY_S = 1.0  # between reads while PostgreSQL is unavailable
WORKER_HEADER = "x-gyre-proxy-worker"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    engines: Sequence[tuple[str, str]]  # (name, base URL) of SGLang-API engines
    model_name: str = "gyre-policy"
    # A save_pretrained folder whose tokenizer and chat template render requests (None: the
    # bundled Qwen3.6 vocabulary and gyre's Qwen3 template).
    model_dir: Path | None = None
    harness: str = "claude-code"
    context_limit: int = 131_072
    # The most tokens one model call may generate, whatever the harness asks for (None: what
    # the request's max_tokens says).
    max_tokens: int | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    # Concurrent (and kept-alive) connections to each engine; each streamed generation
    # holds one, so fewer would queue generations behind each other.
    engine_connections: int = 1024
    run_id: str | None = None  # serve this live run's registered engines too
    # Where staged records wait until the store takes them (``RecordSpool``); None: in memory
    # only, lost if the process dies. One folder per proxy process; the next one on it sends
    # what this one left.
    spool_dir: Path | None = None
    spool_store: str = ""  # the store the records are for (its URL without credentials)
    answers_log: Path | None = None  # a JSON line per model-call record staged (``AnswerLog``)
    replay_wait_s: float = 30.0  # how long serving waits for the records a predecessor left
    # The folder the workers of `--workers N` write their metrics to (prometheus_client's
    # multiprocess mode, switched on by PROMETHEUS_MULTIPROC_DIR); None: this process's only.
    metrics_dir: Path | None = None
    # The most model calls this process takes at once; past it a call is refused in its API's
    # overload shape with ``retry-after: retry_after_s`` (``service/capacity.py``). 0: no bound.
    max_in_flight: int = 0
    retry_after_s: float = 1.0
    # Memory for the full token sequences of recent records (``answer/sequences.py``); one
    # past it is rebuilt from the log when next needed.
    sequence_cache_bytes: int = 1 << 30
    # Characters of message text kept so a request hashes only the messages it adds
    # (``ingest/chains.py``); past it an execution's next request is hashed whole.
    chain_cache_chars: int = 1 << 30


def chat_format(model_dir: Path | None) -> ChatFormat:
    """The checkpoint's tokenizer and template, or the demo's default (raises
    ``CheckpointLoadError`` naming the file that cannot be loaded)."""
    return Qwen3Template(qwen_tokenizer()) if model_dir is None else load_chat_format(model_dir)


class ProxyService:
    """The proxy on top of ``log``: a context manager that serves HTTP from a thread.

    One of several worker processes (``gyre proxy serve --workers N``) is given the listening
    ``sock`` it shares with the others, the ``sync`` that keeps its caches coherent with
    theirs, and a ``worker`` name it sends back in an ``x-gyre-proxy-worker`` header (with
    its pid), so a client can tell which process answered.
    """

    def __init__(
        self,
        log: EventLog,
        config: ProxyConfig,
        *,
        sock: socket.socket | None = None,
        sync: ExecutionSync | None = None,
        worker: str | None = None,
    ) -> None:
        self.log = log
        self.config = config
        self.clients = [
            (name, EngineClient(EngineClientConfig(base_url=url, max_connections=config.engine_connections)))
            for name, url in config.engines
        ]
        self.router = Router(self.clients, lookup=self._placement)
        recorder = TrajectoryRecorder(log)
        self.spool = RecordSpool(
            recorder,
            directory=config.spool_dir,
            store=config.spool_store,
            answers_log=config.answers_log,
            on_written=None if sync is None else sync.written,
            # Other workers wait for a record staged here; one sent again for a predecessor too.
            on_replayed=None if sync is None else sync.staged,
        )
        self.critiques = CritiqueBook(log)
        self.ingestor = Ingestor(
            recorder,
            chat_format(config.model_dir),
            plugin_for(config.harness),
            self.critiques,
            chain_chars=config.chain_cache_chars,
        )
        self.evaluations = LogEvaluations(log, self.critiques, sync=sync)
        self.metrics = ProxyMetrics(multiprocess_dir=config.metrics_dir)
        self.pipeline = AnswerPipeline(
            self.ingestor,
            self.router,
            self.spool,
            context_limit=config.context_limit,
            max_tokens=config.max_tokens,
            sequence_bytes=config.sequence_cache_bytes,
            sync=sync,
            observer=self.metrics,
        )
        self.keys = StoreKeys(log)
        self.app: Starlette = build_app(
            self.pipeline,
            self.keys,
            model_name=config.model_name,
            on_shutdown=self._close_clients,
            evaluations=self.evaluations,
            counters=self._counters,
        )
        self.limit = (
            InFlightLimit(self.app, config.max_in_flight, retry_after_s=config.retry_after_s)
            if config.max_in_flight
            else None
        )
        served: Any = metered(self.limit or self.app, self.metrics)  # and /metrics
        if worker is not None:
            served = with_header(served, WORKER_HEADER, f"{worker} {os.getpid()}")
        self.server = proxy_server(served, host=config.host, port=config.port, sock=sock)

    def _counters(self) -> dict[str, int]:
        """What /health reports beside its status: the record spool's counters and the
        sizes of the sequence and chain caches."""
        counters = {f"spool_{name}": value for name, value in self.spool.stats().items()}
        sequences = self.pipeline.sequences
        counters |= {
            "sequence_cache_bytes": sequences.nbytes,
            "sequence_cache_evicted": sequences.evicted_for_bytes,
        }
        if self.ingestor.chains is not None:
            chains = self.ingestor.chains
            counters |= {"chain_cache_chars": chains.chars, "chain_cache_evicted": chains.evicted_for_chars}
        if self.limit is not None:
            counters |= {"calls_in_flight": self.limit.in_flight, "calls_refused": self.limit.refused}
        return counters

    async def _close_clients(self) -> None:
        for _, client in list(self.clients):
            await client.aclose()

    def _client(self, url: str) -> EngineClient:
        return EngineClient(EngineClientConfig(base_url=url, max_connections=self.config.engine_connections))

    def _placement(self, execution_id: str) -> Binding | None:
        """Where the scheduler placed an execution the follower has not seen yet (its start, or
        the last time it was rerouted)."""
        for recorded in reversed(self.log.read_stream(StreamId("execution", execution_id))):
            if isinstance(recorded.event, ExecutionStarted | ExecutionRerouted):
                return Binding.of(recorded.event.run_id, recorded.event.engine)
        return None

    def apply(self, recorded: RecordedEvent) -> None:
        """Take one followed event into the routing table."""
        event = recorded.event
        if isinstance(event, EngineRegistered):
            if event.run_id != self.config.run_id:
                return
            slot = "pool" if event.cell_index < 0 else f"cell-{event.cell_index}"
            client = self._client(event.url)
            self.clients.append((event.engine, client))
            self.router.add(event.engine, client, run_id=event.run_id, slot=slot)
            return
        self.router.apply(recorded)

    def follow(self, stop: threading.Event, *, after: int = 0) -> None:
        """Apply followed events from position ``after`` until ``stop`` is set (a thread's loop).

        Every record the proxy writes wakes the reader; followed events are rare, so it reads
        at most every 100 ms instead of once per append. While PostgreSQL is unavailable it
        waits and reads on from the last event it applied: an outage must not leave the proxy
        routing to engines that have since moved."""
        position = after
        while not stop.is_set():
            try:
                for batch in subscribe(self.log, position, types=FOLLOWED, poll_s=1.0, min_interval_s=0.1):
                    for recorded in batch:
                        self.apply(recorded)
                        position = recorded.position
                    if stop.is_set():
                        return
            except StoreUnavailable:
                stop.wait(FOLLOW_RETRY_S)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def __enter__(self) -> ProxyService:
        if self.spool.replayed and not self.spool.flush(self.config.replay_wait_s):
            # Served before they are in the log, the executions they belong to would be read
            # back without them; they go on being retried meanwhile.
            log.warning(
                "proxy: %d records left by an earlier process are not written after %.0f s; serving anyway",
                self.spool.pending, self.config.replay_wait_s,
            )  # fmt: skip
        self.server.__enter__()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.server.__exit__(et, ev, tb)
        finally:
            self.spool.close()


def with_header(app: Any, name: str, value: str) -> Any:
    """``app`` (ASGI) with one more header on every HTTP response."""
    header = (name.encode(), value.encode())

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_with_header(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await app(scope, receive, send_with_header)

    return wrapped
