"""The SSE event pump and response: timeouts that leave the source intact, closing that reaches
it, one send per item, and a client that goes away stopping the source."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gyre_proxy import Overloaded
from gyre_proxy.api.sse import (
    SSE_HEADERS,
    EventPump,
    Pulse,
    SSEResponse,
    StreamFraming,
    data_event,
    named_event,
    open_stream,
)

pytestmark = pytest.mark.anyio


class Source:
    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.ended = ""

    async def run(self) -> AsyncIterator[int]:
        try:
            for i, delay in enumerate(self.delays):
                await asyncio.sleep(delay)
                yield i
        except BaseException as exc:
            self.ended = type(exc).__name__
            raise
        self.ended = "completed"


async def test_ticks_do_not_disturb_a_slow_source() -> None:
    source = Source([0.0, 0.15, 0.0])
    pump = EventPump(source.run())
    seen: list[int | Pulse] = []
    while (item := await pump.next(0.02)) is not Pulse.END:
        seen.append(item)
    assert [x for x in seen if x is not Pulse.TICK] == [0, 1, 2]
    assert seen.count(Pulse.TICK) >= 3 and source.ended == "completed"


async def test_a_long_first_wait_does_not_delay_the_ticks_of_shorter_ones() -> None:
    # The first wait arms the pump's one timer far ahead; a shorter wait after it must still
    # tick on its own deadline (the guard only bounds a failure, it is not a timing check).
    source = Source([0.0, 60.0])
    pump = EventPump(source.run())
    assert await pump.next(30.0) == 0
    assert await asyncio.wait_for(pump.next(0.02), 5.0) is Pulse.TICK
    await pump.aclose()


async def test_a_timer_left_by_an_earlier_wait_does_not_end_a_later_one_early() -> None:
    # Item 0 comes at once, leaving the timer armed for its 0.05 s deadline; the next wait
    # allows 2 s, and item 1 (0.3 s later) must come out of it, not a tick.
    source = Source([0.0, 0.3])
    pump = EventPump(source.run())
    assert await pump.next(0.05) == 0
    assert await pump.next(2.0) == 1
    await pump.aclose()


async def test_aclose_cancels_a_pending_read_and_closes_the_source() -> None:
    source = Source([0.0, 60.0])
    pump = EventPump(source.run())
    assert await pump.next(1.0) == 0
    assert await pump.next(0.01) is Pulse.TICK  # the read of item 1 is now pending
    await pump.aclose()
    assert source.ended == "CancelledError"
    assert await pump.next(0.01) is Pulse.END


async def test_aclose_between_reads_closes_the_generator() -> None:
    source = Source([0.0, 0.0, 0.0])
    pump = EventPump(source.run(), ahead=1)
    assert await pump.next(1.0) == 0
    await asyncio.sleep(0.01)  # the reader has read item 1 and waits for room for it
    assert pump.ready()
    await pump.aclose()
    assert source.ended == "GeneratorExit"


async def test_the_reader_reads_ahead_up_to_its_bound() -> None:
    source = Source([0.0] * 6)
    pump = EventPump(source.run(), ahead=3)
    assert await pump.next(1.0) == 0
    await asyncio.sleep(0.01)
    assert source.ended == ""  # three items queued: the reader waits for room
    assert [await pump.next(1.0) for _ in range(5)] == [1, 2, 3, 4, 5]
    assert await pump.next(1.0) is Pulse.END and source.ended == "completed"


async def test_source_errors_come_out_of_next() -> None:
    async def failing() -> AsyncIterator[int]:
        yield 1
        raise ValueError("boom")

    pump = EventPump(failing())
    assert await pump.next(1.0) == 1
    with pytest.raises(ValueError, match="boom"):
        await pump.next(1.0)


def test_framing() -> None:
    assert named_event("ping", b'{"type":"ping"}') == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert data_event(b"[DONE]") == b"data: [DONE]\n\n"


async def test_a_second_aclose_waits_for_the_first_to_finish() -> None:
    cleaned: list[str] = []

    async def slow_cleanup() -> AsyncIterator[int]:
        try:
            yield 0
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.05)  # the answerer's cleanup: abort the engine, stage the record
            cleaned.append("done")

    pump = EventPump(slow_cleanup())
    assert await pump.next(1.0) == 0
    assert await pump.next(0.01) is Pulse.TICK
    first = asyncio.ensure_future(pump.aclose())
    await asyncio.sleep(0)
    await pump.aclose()  # must not return before the first close completed
    assert cleaned == ["done"]
    await first


# -- the streaming response -----------------------------------------------------------------------


def framing_of(items: list[str]) -> StreamFraming[str]:
    """Frames each item as ``name`` events; the stream is finished once "done" was encoded
    (and, like the API encoders, frames nothing after that)."""

    def finished() -> bool:
        return any(item.endswith("done") for item in items)

    def encode(item: str) -> list[bytes]:
        if finished():
            return []
        items.append(item)
        return [named_event(part, b"{}") for part in item.split("+")]

    return StreamFraming[str](
        opening=lambda first: (b"open\n\n",),
        encode=encode,
        ping=b": ping\n\n",
        error=lambda err: named_event("error", err.message.encode()),
        finished=finished,
    )


class Client:
    """The ASGI side of one response: records sends, says ``http.disconnect`` when told."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def bodies(self) -> list[tuple[bytes, bool]]:
        return [(m["body"], m["more_body"]) for m in self.sent if m["type"] == "http.response.body"]


async def respond(source: AsyncIterator[str], client: Client, ping_interval_s: float = 10.0) -> None:
    pump, first = await open_stream(source, 1.0)
    response = SSEResponse(pump, first, framing_of([]), ping_interval_s, headers=SSE_HEADERS)
    await response({"type": "http"}, client.receive, client.send)  # type: ignore[arg-type]


async def test_items_queued_together_go_out_in_one_send_and_the_finishing_one_ends_the_body() -> None:
    ended: list[bool] = []

    async def source() -> AsyncIterator[str]:
        yield "start"
        await asyncio.sleep(0.02)  # the response writes the opening and waits
        yield "a+b"
        yield "c"  # queued while "a+b" is taken: written with it
        await asyncio.sleep(0.02)
        yield "stop+delta+done"
        yield "after+the+end"  # the source still runs to its end
        ended.append(True)

    client = Client()
    await respond(source(), client)
    assert ended == [True]
    assert client.sent[0]["type"] == "http.response.start"
    assert client.bodies == [
        (b"open\n\n" + named_event("start", b"{}"), True),
        (named_event("a", b"{}") + named_event("b", b"{}") + named_event("c", b"{}"), True),
        (named_event("stop", b"{}") + named_event("delta", b"{}") + named_event("done", b"{}"), False),
    ]


async def test_an_item_that_arrives_alone_is_written_at_once() -> None:
    async def source() -> AsyncIterator[str]:
        for item in ("start", "a", "b", "done"):
            await asyncio.sleep(0.01)
            yield item

    client = Client()
    await respond(source(), client)
    assert client.bodies == [
        (b"open\n\n" + named_event("start", b"{}"), True),
        (named_event("a", b"{}"), True),
        (named_event("b", b"{}"), True),
        (named_event("done", b"{}"), False),
    ]


async def test_quiet_source_gets_pings_and_an_unfinished_end_is_an_error() -> None:
    async def source() -> AsyncIterator[str]:
        yield "start"
        await asyncio.sleep(0.12)

    client = Client()
    await respond(source(), client, ping_interval_s=0.02)
    bodies = client.bodies
    assert bodies.count((b": ping\n\n", True)) >= 2
    assert bodies[-1][1] is False and bodies[-1][0].startswith(b"event: error")
    assert b"ended before it was complete" in bodies[-1][0]


async def test_source_error_after_the_start_is_the_last_frame() -> None:
    async def source() -> AsyncIterator[str]:
        yield "start"
        raise Overloaded("no engine could finish this request")

    client = Client()
    await respond(source(), client)
    body, more = client.bodies[-1]  # the error was queued behind "start": one write
    assert not more and body.endswith(named_event("error", b"no engine could finish this request"))


async def test_client_going_away_closes_a_quiet_source() -> None:
    source = Source([0.0, 60.0])
    client = Client()

    async def as_text() -> AsyncIterator[str]:
        async for i in source.run():
            yield str(i)

    task = asyncio.ensure_future(respond(as_text(), client))
    await asyncio.sleep(0.05)
    assert not task.done()
    client.gone.set()
    await asyncio.wait_for(task, 5)  # ends without waiting out the 60 s
    assert source.ended == "CancelledError"
