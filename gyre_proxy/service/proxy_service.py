"""Assembling a running proxy: the store, engines, routing, the spool, keys and the app.

``ProxyService`` is what ``gyre proxy serve`` runs and what the end-to-end tests start:
one object that owns the engine clients, the record spool and the HTTP app, and closes
them in order (the spool is flushed before the engines go away).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from starlette.applications import Starlette

from gyre_proxy.answer import AnswerPipeline, Router
from gyre_proxy.api import build_app, proxy_server
from gyre_proxy.engines import EngineClient, EngineClientConfig, qwen_tokenizer
from gyre_proxy.ingest import (
    ClaudeCodeHarness,
    GenericHarness,
    HarnessPlugin,
    Ingestor,
    Qwen3Template,
    RecordSpool,
)
from gyre_proxy.service.keys import StoreKeys
from gyre_store.log import EventLog
from gyre_store.trees import TrajectoryRecorder


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    engines: Sequence[tuple[str, str]]  # (name, base URL) of SGLang-API engines
    model_name: str = "gyre-policy"
    harness: str = "claude-code"
    context_limit: int = 131_072
    host: str = "127.0.0.1"
    port: int | None = None
    # Concurrent (and kept-alive) connections to each engine; each streamed generation
    # holds one, so fewer would queue generations behind each other.
    engine_connections: int = 1024


def _plugin(name: str) -> HarnessPlugin:
    return ClaudeCodeHarness() if name == "claude-code" else GenericHarness()


class ProxyService:
    """The proxy on top of ``log``: a context manager that serves HTTP from a thread."""

    def __init__(self, log: EventLog, config: ProxyConfig) -> None:
        self.log = log
        self.config = config
        self.clients = [
            (name, EngineClient(EngineClientConfig(base_url=url, max_connections=config.engine_connections)))
            for name, url in config.engines
        ]
        self.router = Router(self.clients)
        recorder = TrajectoryRecorder(log)
        self.spool = RecordSpool(recorder)
        self.ingestor = Ingestor(recorder, Qwen3Template(qwen_tokenizer()), _plugin(config.harness))
        self.pipeline = AnswerPipeline(
            self.ingestor, self.router, self.spool, context_limit=config.context_limit
        )
        self.keys = StoreKeys(log)
        self.app: Starlette = build_app(
            self.pipeline, self.keys, model_name=config.model_name, on_shutdown=self._close_clients
        )
        self.server = proxy_server(self.app, host=config.host, port=config.port)

    async def _close_clients(self) -> None:
        for _, client in self.clients:
            await client.aclose()

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def __enter__(self) -> ProxyService:
        self.server.__enter__()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.server.__exit__(et, ev, tb)
        finally:
            self.spool.close()
