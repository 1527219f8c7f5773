"""Server-sent events for both adapters: framing, a pump that ticks while the answerer is quiet,
and a streaming response that always closes the answerer's stream.

Closing matters: the answerer aborts its engine request when its async generator is closed, so
a harness that hangs up mid-answer must not leave a generation running. This module knows
nothing of either API's event names.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Generic, TypeVar

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gyre_proxy.api.errors import as_api_error
from gyre_proxy.deadline import DeadlineTimer
from gyre_proxy.exceptions import ApiError

T = TypeVar("T")
log = logging.getLogger(__name__)

SSE_MEDIA_TYPE = "text/event-stream"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
COMMENT_PING = b": ping\n\n"
DATA_DONE = b"data: [DONE]\n\n"
# The ASGI scope key under which a stream that ended with an error event leaves that ApiError.
STREAM_ERROR_KEY = "gyre.stream_error"


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

    ``asyncio.wait_for(anext(it))`` would cancel the generator on every timeout; here one
    reader task per stream reads the source and queues its items, and a timeout leaves the
    read in flight; only ``aclose`` cancels it. The reader reads ahead of ``next`` (at most
    ``ahead`` items queued; then it waits for room): a token is then one wake of the reader
    (its data arrived) and one of the response, with no hand-back between them, and the
    items that arrived while the response was writing are all there for its next write
    (``ready``). Exceptions from the source propagate out of ``next``, after the items read
    before them. One task per stream, not one per item: a task and an ``asyncio.wait`` per
    streamed token cost about a tenth of the proxy's event loop at 128 streams
    (benchmarks/bench_proxy.py).
    """

    def __init__(self, source: AsyncIterator[T], *, ahead: int = 256) -> None:
        self._source = source
        self._ahead = max(1, ahead)
        self._items: collections.deque[T | Pulse | _Raised] = collections.deque()
        self._reader: asyncio.Task[None] | None = None
        self._room: asyncio.Future[None] | None = None  # the reader waits on it while the queue is full
        self._waiter: asyncio.Future[None] | None = None  # ``next`` waits on it
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        # The quiet timer: one per stream rather than one made and cancelled for every item
        # (a fair share of a streamed token's cost); made with the reader.
        self._quiet: DeadlineTimer | None = None

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if len(self._items) >= self._ahead:
                    self._room = loop.create_future()
                    await self._room
                try:
                    item: T | Pulse | _Raised = await anext(self._source)
                except StopAsyncIteration:
                    item = Pulse.END
                self._push(item)
                if item is Pulse.END:
                    return
        except Exception as exc:  # handed to ``next``; cancellation is not caught
            self._push(_Raised(exc))

    def _push(self, item: T | Pulse | _Raised) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _took(self) -> T | Pulse:
        """The first queued item (raising a queued error), making room for the reader."""
        item = self._items.popleft()
        if self._room is not None and not self._room.done():
            self._room.set_result(None)
        if isinstance(item, _Raised):
            self._closed = True
            raise item.error
        if item is Pulse.END:
            self._closed = True
        return item

    def ready(self) -> bool:
        """True when ``next`` would return at once: an item is queued (or the pump is closed)."""
        return self._closed or bool(self._items)

    async def next(self, timeout_s: float | None) -> T | Pulse:
        """The next item, ``Pulse.TICK`` after ``timeout_s`` of silence, or ``Pulse.END``."""
        if self._closed:
            return Pulse.END
        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read())
            self._quiet = DeadlineTimer(asyncio.get_running_loop(), self._wake)
        if not self._items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            quiet = self._quiet if timeout_s is not None else None
            if quiet is not None and timeout_s is not None:
                quiet.waiting(timeout_s)
            try:
                await waiter
            finally:
                self._waiter = None
                if quiet is not None:
                    quiet.waited()
            if self._closed:
                return Pulse.END  # closed (by the client going away) while this read waited
            if not self._items:
                return Pulse.TICK
        return self._took()

    def _wake(self) -> None:
        """Wake the wait in progress (its deadline passed, or the pump closed)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def aclose(self) -> None:
        """Stop the source: cancel a pending read, then close the generator. Idempotent.

        A second caller (the response ending while the disconnect watcher closes the pump)
        waits until the first one's close is complete: the answerer's cleanup is not cut short.
        """
        self._closed = True
        if self._closing is not None:
            with anyio.CancelScope(shield=True):
                await asyncio.shield(self._closing)
            return
        self._closing = asyncio.get_running_loop().create_future()
        try:
            await self._close()
        finally:
            self._closing.set_result(None)

    async def _close(self) -> None:
        reader, self._reader = self._reader, None
        if self._quiet is not None:
            self._quiet.stop()
        self._wake()
        # Items read ahead and never taken are dropped: the response is over.
        with anyio.CancelScope(shield=True):
            if reader is not None and not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):  # the read it was stopped in
                    await reader
            # The source's cleanup runs in the cancelled read (or in ``aclose`` below): the
            # answerer stops its engine and stages the partial record there. An error in it
            # is never delivered to anyone now, so it is logged here, or the record it was
            # staging would vanish without a trace.
            while self._items:
                item = self._items.popleft()
                if isinstance(item, _Raised):
                    _cleanup_failed(item.error)
            aclose = getattr(self._source, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception as exc:
                    _cleanup_failed(exc)


def _cleanup_failed(error: Exception) -> None:
    log.error(
        "an answer's stream failed while it was being closed (its client gone or its response "
        "over): the record of that call may be lost: %s: %s",
        type(error).__name__, error, exc_info=error,
    )  # fmt: skip


class _Raised:
    """An exception the source raised, waiting to be raised by ``EventPump.next``."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


async def open_stream(source: AsyncIterator[T], timeout_s: float) -> tuple[EventPump[T], T | Pulse]:
    """A pump over ``source`` and its first item, waiting at most ``timeout_s`` for it.

    The wait lets a request the answerer refuses at once (context too long, overloaded) get a
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


class SSEResponse(Response):
    """The streaming answer: the pump's items framed as SSE, until the stream is finished.

    Starlette's ``StreamingResponse`` would spend a task group (two tasks, cancel scopes)
    on every answer and one ASGI send per frame; this writes the frames of every item
    queued by then in one send (one socket write for the tokens that arrived while the last
    write was made), ends the body in the same send as the finishing item's frames, and watches for
    the client going away from a single task. The pump is closed however the response ends, so the
    answerer aborts its engine request when the harness hangs up mid-answer.
    """

    media_type = SSE_MEDIA_TYPE

    def __init__(
        self,
        pump: EventPump[T],
        first: T | Pulse,
        framing: StreamFraming[T],
        ping_interval_s: float,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._pump: EventPump[Any] = pump
        self._first: Any = first
        self._framing: StreamFraming[Any] = framing
        self._ping_interval_s = ping_interval_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = self._pump
        framing = self._framing
        watcher = asyncio.ensure_future(_close_on_disconnect(receive, pump))
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            frames = list(framing.opening(self._first))
            item = self._first
            while True:
                try:
                    last = _frames(item, framing, frames, scope)
                except Exception as exc:  # the status line is sent: errors now travel as an event
                    frames.append(_error_frame(scope, framing, as_api_error(exc)))
                    last = True
                if last:
                    await send({"type": "http.response.body", "body": b"".join(frames), "more_body": False})
                    return
                # Items that arrived while this one was written join its frames in one write.
                # The finishing frames wait for the source's end (at once, from the answerer) so
                # they and the end of the body go out together; a quiet source gets them anyway.
                if frames and not pump.ready() and (not framing.finished() or item is Pulse.TICK):
                    await send({"type": "http.response.body", "body": b"".join(frames), "more_body": True})
                    frames.clear()
                try:
                    item = await pump.next(self._ping_interval_s)
                except Exception as exc:
                    frames.append(_error_frame(scope, framing, as_api_error(exc)))
                    item = _FAILED
        finally:
            # Close first: if the watcher is closing the pump already, this waits for it.
            with anyio.CancelScope(shield=True):
                await pump.aclose()
            watcher.cancel()


_FAILED = object()  # the source raised; its error frame is already queued


def _frames(item: object, framing: StreamFraming[Any], out: list[bytes], scope: Scope) -> bool:
    """Append ``item``'s frames to ``out``; True when the stream ends with them."""
    if item is _FAILED:
        return True
    if item is Pulse.END:
        if not framing.finished():
            out.append(
                _error_frame(scope, framing, ApiError("the model's answer ended before it was complete"))
            )
        return True
    if item is Pulse.TICK:
        out.append(framing.ping)
        return False
    out.extend(framing.encode(item))
    return False


def _error_frame(scope: Scope, framing: StreamFraming[Any], err: ApiError) -> bytes:
    """The error event ending a stream; the error is noted in the request's scope
    (``STREAM_ERROR_KEY``), where middleware that counts errors finds it after the response."""
    scope[STREAM_ERROR_KEY] = err
    return framing.error(err)


async def _close_on_disconnect(receive: Receive, pump: EventPump[Any]) -> None:
    """Close the pump (so the answerer stops its engine request) once the client goes away."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # the server cannot tell any more; the response's end still closes it
        return
    await pump.aclose()
