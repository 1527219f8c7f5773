"""The SSE event pump: timeouts that leave the source intact, and closing that reaches it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gyre_proxy.sse import EventPump, Pulse, data_event, named_event

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


async def test_aclose_cancels_a_pending_read_and_closes_the_source() -> None:
    source = Source([0.0, 60.0])
    pump = EventPump(source.run())
    assert await pump.next(1.0) == 0
    assert await pump.next(0.01) is Pulse.TICK  # the read of item 1 is now pending
    await pump.aclose()
    assert source.ended == "CancelledError"
    assert await pump.next(0.01) is Pulse.END


async def test_aclose_between_reads_closes_the_generator() -> None:
    source = Source([0.0, 0.0])
    pump = EventPump(source.run())
    assert await pump.next(1.0) == 0
    await pump.aclose()
    assert source.ended == "GeneratorExit"


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
