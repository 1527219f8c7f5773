"""The proxy's harness-facing HTTP app: both APIs over one ``ProxyCore``, and a test server.

``build_app`` returns a plain Starlette app (run it under any ASGI server); ``ProxyServer``
serves one on a background uvicorn thread as a context manager, for tests and demos. Routing
to engines, recording and the rest of the proxy's work live behind the core, not here.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre_proxy.api import anthropic as anthropic_api
from gyre_proxy.api import openai_chat as openai_api
from gyre_proxy.api.errors import ApiError, NotFound, anthropic_error_body, openai_error_body
from gyre_proxy.chat.answerer import KeyResolver, ProxyCore
from gyre_proxy.exceptions import GyreProxyError

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Idle keep-alive connections are kept longer than clients keep theirs (httpx, which the
# Anthropic and OpenAI SDKs use, 5 s; Node 4 s), so the client always closes first. With
# uvicorn's 5 s a request sent on a connection the server is just closing is lost, and on
# uvloop, which runs due timers before reading sockets, that race is frequent under load.
KEEP_ALIVE_S = 75


@dataclass(frozen=True)
class ApiSettings:
    """What both adapters need beyond the core.

    ``stream_start_timeout_s`` is how long a streaming request waits for the core's first
    event before sending its status line: a refusal within it is an HTTP error, a later one
    an SSE error event. ``ping_interval_s`` paces keep-alive pings while the core is quiet.
    """

    model_name: str
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    ping_interval_s: float = 10.0
    stream_start_timeout_s: float = 5.0


def build_app(
    core: ProxyCore,
    keys: KeyResolver,
    *,
    model_name: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ping_interval_s: float = 10.0,
    stream_start_timeout_s: float = 5.0,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
) -> Starlette:
    """The Starlette app serving the Anthropic and OpenAI APIs over ``core``, and ``/health``.

    ``on_shutdown`` runs on the server's event loop as it stops (engine clients opened on
    that loop must be closed there).
    """
    settings = ApiSettings(model_name, max_body_bytes, ping_interval_s, stream_start_timeout_s)

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def http_error(request: Request, exc: Exception) -> Response:
        # Unknown paths and methods answer in the shape of the API the client speaks.
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        err: ApiError = (
            NotFound(f"{request.method} {request.url.path}: not found") if status == 404 else ApiError()
        )
        if status == 405:
            err = ApiError(f"{request.method} is not allowed on {request.url.path}")
        if request.url.path.startswith("/v1/messages") or "anthropic-version" in request.headers:
            return Response(anthropic_error_body(err), status_code=status, media_type="application/json")
        return Response(openai_error_body(err), status_code=status, media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            await on_shutdown()

    return Starlette(
        routes=[
            *anthropic_api.routes(core, keys, settings),
            *openai_api.routes(core, keys, settings),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ProxyServerError(GyreProxyError):
    """The proxy's HTTP server could not be started."""


class ProxyServer:
    """``build_app(...)`` on ``http://host:port``, served by uvicorn from a thread."""

    def __init__(
        self,
        app: Starlette,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._startup_timeout_s = startup_timeout_s
        config = uvicorn.Config(
            app,
            host=host,
            port=self.port,
            log_level="warning",
            lifespan="on",
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="gyre-proxy", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise ProxyServerError(f"the proxy did not start on {self.base_url}")
            time.sleep(0.01)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
