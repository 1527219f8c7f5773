"""The HTTP seam under ``EngineClient``: aiohttp for real engines, httpx for plugged transports.

``EngineHttp`` sends a request and answers a status and body, or opens a streamed response
whose connection is reused only when its body was read to the end (closing one early is how
SGLang learns to abort a request). Each implementation turns its library's transport errors
into ``EngineUnavailable``; HTTP statuses and bodies are the client's business, not this one's.

aiohttp serves real engines: under 128 concurrent streams httpx's connection pool spent
several ms of CPU per request scanning its connections, and opening a new connection per
request instead cost about 1 ms. httpx stays for in-process ASGI apps and mock transports.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import aiohttp
import httpx

from gyre_proxy.deadline import DeadlineTimer
from gyre_proxy.exceptions import EngineUnavailable


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A whole response: its status and body."""

    status: int
    content: bytes


class HttpStream(Protocol):
    """An open streamed response."""

    status: int

    async def read(self) -> bytes:
        """The whole (remaining) body; for error statuses."""

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises ``EngineUnavailable`` if the connection breaks."""


class EngineHttp(Protocol):
    """HTTP/1.1 to one engine base URL."""

    async def request(self, method: str, path: str, content: bytes | None) -> HttpResponse:
        """Send and read the whole answer; ``EngineUnavailable`` when there is none."""

    def stream(
        self, method: str, path: str, content: bytes
    ) -> contextlib.AbstractAsyncContextManager[HttpStream]:
        """Send and open the answer; on exit the connection is reused only if it was read to its end."""

    async def aclose(self) -> None: ...


def _unavailable(method: str, path: str, exc: BaseException) -> EngineUnavailable:
    if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
        return EngineUnavailable(f"{method} {path} timed out: {exc!r}")
    return EngineUnavailable(f"{method} {path} failed: {exc!r}")


_JSON = {"content-type": "application/json"}


# -- aiohttp ---------------------------------------------------------------------------------


class _AiohttpStream:
    """A streamed body whose reads time out after ``idle_s`` without data, as aiohttp's
    ``sock_read`` does, but from one timer per stream: aiohttp moves its timer on every chunk
    (a timer cancelled and made per streamed token), this one is moved on only when it fires
    while data is still coming (``DeadlineTimer``)."""

    def __init__(self, response: aiohttp.ClientResponse, what: str, idle_s: float | None) -> None:
        self.status = response.status
        self._response = response
        self._what = what
        self._idle_s = idle_s

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        content = self._response.content
        idle_s = self._idle_s
        idle = None
        if idle_s is not None:
            idle = DeadlineTimer(asyncio.get_running_loop(), partial(_time_out, content))
        try:
            # Not ``readline``: aiohttp refuses lines over 128 KiB, and a cumulative SGLang
            # chunk late in a long answer is far longer.
            while True:
                if idle is not None and idle_s is not None:
                    idle.waiting(idle_s)
                chunk = await content.readany()
                if idle is not None:
                    idle.waited()
                if not chunk:  # the end of the body
                    return
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineUnavailable(f"{self._what} broke: {exc!r}") from exc
        finally:
            if idle is not None:
                idle.stop()


def _time_out(content: aiohttp.StreamReader) -> None:
    """Fail ``content``'s pending read as aiohttp's ``sock_read`` timeout does."""
    content.set_exception(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))


class AiohttpEngineHttp:
    """aiohttp with a keep-alive pool of ``max_connections``; the session is made on first use,
    in the event loop that uses it (the proxy builds its clients before its loop runs)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
        keepalive_s: float,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=timeout_s)
        # A stream's body is timed by ``_AiohttpStream`` (``DeadlineTimer``); its head by ``stream``.
        self._stream_timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=None)
        self._idle_s = timeout_s
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=0, keepalive_timeout=self._keepalive_s
            )
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=connector,
                # Bodies are taken as sent, and no compression is asked for: engines answer
                # uncompressed JSON and SSE, and decoding would cost CPU on every chunk.
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def request(self, method: str, path: str, content: bytes | None) -> HttpResponse:
        headers = _JSON if content is not None else None
        try:
            async with self._http().request(method, self.base_url + path, data=content, headers=headers) as r:
                return HttpResponse(r.status, await r.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unavailable(method, path, exc) from exc

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, content: bytes) -> AsyncIterator[HttpStream]:
        try:
            async with asyncio.timeout(self._idle_s):  # the head, as ``sock_read`` bounds it
                response = await self._http().request(
                    method, self.base_url + path, data=content, headers=_JSON, timeout=self._stream_timeout
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unavailable(method, path, exc) from exc
        try:
            yield _AiohttpStream(response, f"{method} {path} stream", self._idle_s)
        finally:
            # ``release`` puts a connection whose body ended back in the pool; ``close`` drops
            # one that still carries an unread body (an abort, a client gone, an error).
            if response.content.at_eof():
                response.release()
            else:
                response.close()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


# -- httpx -----------------------------------------------------------------------------------


class _HttpxStream:
    def __init__(self, response: httpx.Response, what: str) -> None:
        self.status = response.status_code
        self._response = response
        self._what = what

    async def read(self) -> bytes:
        try:
            return await self._response.aread()
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{self._what} broke: {exc!r}") from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_bytes():
                yield chunk
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{self._what} broke: {exc!r}") from exc


class HttpxEngineHttp:
    """httpx over any transport: ``httpx.ASGITransport`` for an in-process app, a mock in tests."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        transport: httpx.AsyncBaseTransport,
    ) -> None:
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport)

    async def request(self, method: str, path: str, content: bytes | None) -> HttpResponse:
        headers = _JSON if content is not None else None
        try:
            response = await self._http.request(method, path, content=content, headers=headers)
        except httpx.TransportError as exc:
            raise _unavailable(method, path, exc) from exc
        return HttpResponse(response.status_code, response.content)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, content: bytes) -> AsyncIterator[HttpStream]:
        request = self._http.build_request(method, path, content=content, headers=_JSON)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise _unavailable(method, path, exc) from exc
        try:
            yield _HttpxStream(response, f"{method} {path} stream")
        finally:
            await response.aclose()  # reuses the connection only if the body was read to its end

    async def aclose(self) -> None:
        await self._http.aclose()


async def drain(chunks: AsyncIterator[bytes], timeout_s: float) -> None:
    """Read what is left of a body so its connection can be reused; give up quietly after
    ``timeout_s`` or on a broken connection (the answer is already complete)."""
    with contextlib.suppress(TimeoutError, EngineUnavailable):
        async with asyncio.timeout(timeout_s):
            async for _ in chunks:
                pass
