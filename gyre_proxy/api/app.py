"""The proxy's harness-facing HTTP app: both APIs over one ``Answerer``, and a test server.

``build_app`` returns a plain Starlette app (run it under any ASGI server); ``proxy_server``
serves one on a background uvicorn thread as a context manager, for tests and demos. Routing
to engines, recording and the rest of the proxy's work live behind the answerer, not here.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gyre_proxy.api import anthropic as anthropic_api
from gyre_proxy.api import gyre_api
from gyre_proxy.api import openai_chat as openai_api
from gyre_proxy.api import openai_responses as responses_api
from gyre_proxy.api.adapter import DEFAULT_MAX_BODY_BYTES, ApiSettings
from gyre_proxy.api.errors import anthropic_error_response, openai_error_response
from gyre_proxy.chat import Answerer, EvaluationGateway, KeyResolver
from gyre_proxy.exceptions import ApiError, NotFound
from gyre_proxy.hosting import ServerThread

# Idle keep-alive connections are kept longer than clients keep theirs (httpx, which the
# Anthropic and OpenAI SDKs use, 5 s; Node 4 s), so the client always closes first. With
# uvicorn's 5 s a request sent on a connection the server is just closing is lost, and on
# uvloop, which runs due timers before reading sockets, that race is frequent under load.
KEEP_ALIVE_S = 75


def build_app(
    answerer: Answerer,
    keys: KeyResolver,
    *,
    model_name: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ping_interval_s: float = 10.0,
    stream_start_timeout_s: float = 5.0,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    evaluations: EvaluationGateway | None = None,
    counters: Callable[[], Mapping[str, int]] | None = None,
) -> Starlette:
    """The Starlette app serving the Anthropic Messages, OpenAI Chat Completions and OpenAI
    Responses APIs over ``answerer``, and ``/health`` (with ``counters()`` beside its status);
    with ``evaluations``, also gyre's ``/gyre/v1/evaluate`` for executions asking for one.

    ``on_shutdown`` runs on the server's event loop as it stops (engine clients opened on
    that loop must be closed there).
    """
    settings = ApiSettings(model_name, max_body_bytes, ping_interval_s, stream_start_timeout_s)

    async def health(request: Request) -> Response:
        if counters is None:
            return Response(b'{"status":"ok"}', media_type="application/json")
        return JSONResponse({"status": "ok", **counters()})

    async def http_error(request: Request, exc: Exception) -> Response:
        # Unknown paths and methods answer in the shape of the API the client speaks.
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        err: ApiError = (
            NotFound(f"{request.method} {request.url.path}: not found") if status == 404 else ApiError()
        )
        if status == 405:
            err = ApiError(f"{request.method} is not allowed on {request.url.path}")
        if request.url.path.startswith("/v1/messages") or "anthropic-version" in request.headers:
            return anthropic_error_response(err, status=status)
        return openai_error_response(err, status=status)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            await on_shutdown()

    return Starlette(
        routes=[
            *anthropic_api.routes(answerer, keys, settings),
            *openai_api.routes(answerer, keys, settings),
            *responses_api.routes(answerer, keys, settings),
            *(gyre_api.routes(evaluations, keys, settings) if evaluations is not None else []),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )


def proxy_server(
    app: Any, *, host: str = "127.0.0.1", port: int | None = None, sock: socket.socket | None = None
) -> ServerThread:
    """``app`` (from ``build_app``) to serve on ``http://host:port`` (or on the listening
    ``sock``) from a thread, entered as a context manager; its idle connections outlive the
    clients' (``KEEP_ALIVE_S``)."""
    return ServerThread(app, name="the proxy", host=host, port=port, keep_alive_s=KEEP_ALIVE_S, sock=sock)
