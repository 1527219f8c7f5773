"""Server-sent events for both adapters: framing, a pump that ticks while the core is quiet,
and a streaming response that always closes the core's stream.

Closing matters: the core aborts its engine request when its async generator is closed, so
a harness that hangs up mid-answer must not leave a generation running. This module knows
nothing of either API's event names.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gyre_proxy.api_errors import ApiError, as_api_error

T = TypeVar("T")

SSE_MEDIA_TYPE = "text/event-stream"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
COMMENT_PING = b": ping\n\n"
DATA_DONE = b"data: [DONE]\n\n"


def named_event(name: str, payload: bytes) -> bytes:
    """One SSE event with an ``event:`` line, as the Anthropic API sends them."""
    return b"event: " + name.encode() + b"\ndata: " + payload + b"\n\n"


def data_event(payload: bytes) -> bytes:
    """One SSE event with only a ``data:`` line, as the OpenAI API sends them."""
    return b"data: " + payload + b"\n\n"


class Pulse(enum.Enum):
    """What ``EventPump.next`` returns when it has no item."""

    TICK = "tick"  # the timeout passed with nothing new
    END = "end"  # the source is exhausted


class EventPump(Generic[T]):
    """Reads an async iterator with a timeout that does not disturb it.

    ``asyncio.wait_for(anext(it))`` would cancel the generator on every timeout; here the
    pending ``anext`` runs in a task that survives timeouts and is only cancelled by
    ``aclose``. Exceptions from the source propagate out of ``next``.
    """

    def __init__(self, source: AsyncIterator[T]) -> None:
        self._source = source
        self._pending: asyncio.Task[T | Pulse] | None = None
        self._closed = False

    async def _advance(self) -> T | Pulse:
        try:
            return await anext(self._source)
        except StopAsyncIteration:
            return Pulse.END

    async def next(self, timeout_s: float | None) -> T | Pulse:
        """The next item, ``Pulse.TICK`` after ``timeout_s`` of silence, or ``Pulse.END``."""
        if self._closed:
            return Pulse.END
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._advance())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout_s)
        if not done:
            return Pulse.TICK
        task, self._pending = self._pending, None
        item = task.result()
        if item is Pulse.END:
            self._closed = True
        return item

    async def aclose(self) -> None:
        """Stop the source: cancel a pending read, then close the generator. Idempotent."""
        self._closed = True
        pending, self._pending = self._pending, None
        with anyio.CancelScope(shield=True):
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
            aclose = getattr(self._source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


class ClosingStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that runs ``on_close`` however the response ends.

    Starlette cancels the body on a client disconnect but does not close the body's
    generator (nor anything it reads from); a cancelled generator that never started
    would not even run its ``finally``. So cleanup hangs off the response itself.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        on_close: Callable[[], Awaitable[None]],
        status_code: int = 200,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(content, status_code=status_code, headers=headers, media_type=SSE_MEDIA_TYPE)
        self._body_source = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self._body_source, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()
                await self._on_close()


async def open_stream(source: AsyncIterator[T], timeout_s: float) -> tuple[EventPump[T], T | Pulse]:
    """A pump over ``source`` and its first item, waiting at most ``timeout_s`` for it.

    The wait lets a request the core refuses at once (context too long, overloaded) get a
    proper HTTP status; an error raised within it is re-raised after closing the source.
    """
    pump = EventPump(source)
    try:
        first = await pump.next(timeout_s)
    except BaseException:
        await pump.aclose()
        raise
    return pump, first


class StreamFraming(Generic[T]):
    """How one API writes a stream: its opening frames, events, pings and errors."""

    def __init__(
        self,
        *,
        opening: Callable[[T | Pulse], Sequence[bytes]],
        encode: Callable[[T], Sequence[bytes]],
        ping: bytes,
        error: Callable[[ApiError], bytes],
        finished: Callable[[], bool],
    ) -> None:
        self.opening = opening
        self.encode = encode
        self.ping = ping
        self.error = error
        self.finished = finished


async def sse_body(
    pump: EventPump[T], first: T | Pulse, framing: StreamFraming[T], ping_interval_s: float
) -> AsyncIterator[bytes]:
    """The response body: frames for each item, a ping per quiet interval, errors as events."""
    for frame in framing.opening(first):
        yield frame
    item = first
    try:
        while True:
            if item is Pulse.END:
                if not framing.finished():
                    yield framing.error(ApiError("the model's answer ended before it was complete"))
                return
            if item is Pulse.TICK:
                yield framing.ping
            else:
                for frame in framing.encode(item):
                    yield frame
            item = await pump.next(ping_interval_s)
    except Exception as exc:  # the status line is sent: errors now travel as an event
        yield framing.error(as_api_error(exc))
