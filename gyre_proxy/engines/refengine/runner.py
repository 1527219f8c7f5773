"""Running the reference engine as a real HTTP server (uvicorn).

``ReferenceEngineServer`` serves on a background thread and is a context manager: entering
starts the decode loop and the server and waits until ``/health`` would answer; leaving
stops both. ``serve`` blocks in the foreground, for ``gyre engine serve``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

import uvicorn

from gyre_proxy.engines.refengine.engine import ReferenceEngine, ReferenceEngineConfig
from gyre_proxy.engines.refengine.server import build_app
from gyre_proxy.hosting import ServerThread


class ReferenceEngineServer:
    """The reference engine on ``http://host:port``, served from a thread."""

    def __init__(
        self,
        config: ReferenceEngineConfig,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        engine: ReferenceEngine | None = None,
        startup_timeout_s: float = 30.0,
    ) -> None:
        self.engine = engine or ReferenceEngine(config)
        self._server = ServerThread(
            build_app(self.engine),
            name="the reference engine",
            host=host,
            port=port,
            startup_timeout_s=startup_timeout_s,
            lifespan="off",
        )
        self.host = host
        self.port = self._server.port

    @property
    def base_url(self) -> str:
        return self._server.base_url

    def __enter__(self) -> Self:
        self.engine.__enter__()
        try:
            self._server.__enter__()
        except BaseException:
            self.engine.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Stop the decode loop first: it finishes open streams with an abort, so uvicorn's
        # graceful shutdown does not wait on them.
        self.engine.__exit__(exc_type, exc, tb)
        self._server.__exit__(exc_type, exc, tb)


def serve(config: ReferenceEngineConfig, *, host: str, port: int) -> None:
    """Serve in the foreground until interrupted."""
    with ReferenceEngine(config) as engine:
        uvicorn.run(build_app(engine), host=host, port=port, log_level="info", lifespan="off")
