"""Running the reference engine as a real HTTP server (uvicorn).

``ReferenceEngineServer`` serves on a background thread and is a context manager: entering
starts the decode loop and the server and waits until ``/health`` would answer; leaving
stops both. ``serve`` blocks in the foreground, for ``gyre engine serve``.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Self

import uvicorn

from gyre_proxy.engines.refengine.engine import ReferenceEngine, ReferenceEngineConfig
from gyre_proxy.engines.refengine.server import build_app
from gyre_proxy.exceptions import ReferenceEngineError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
        self.host = host
        self.port = port or free_port(host)
        self._startup_timeout_s = startup_timeout_s
        uv_config = uvicorn.Config(
            build_app(self.engine), host=host, port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(uv_config)
        self._thread = threading.Thread(target=self._server.run, name="gyre-reference-engine", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        self.engine.__enter__()
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.engine.__exit__(None, None, None)
                raise ReferenceEngineError(f"the reference engine did not start on {self.base_url}")
            time.sleep(0.01)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Stop the decode loop first: it finishes open streams with an abort, so uvicorn's
        # graceful shutdown does not wait on them.
        self.engine.__exit__(exc_type, exc, tb)
        self._server.should_exit = True
        self._thread.join(timeout=10)


def serve(config: ReferenceEngineConfig, *, host: str, port: int) -> None:
    """Serve in the foreground until interrupted."""
    with ReferenceEngine(config) as engine:
        uvicorn.run(build_app(engine), host=host, port=port, log_level="info", lifespan="off")
