"""The partial record of an answer whose client went away reaches the spool, or its loss is
logged: the answerer stages it while its stream is being closed, where no one else sees an
error."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gyre_proxy.answer import AnswerPipeline, Router
from gyre_proxy.api.sse import SSE_HEADERS, SSEResponse, StreamFraming, open_stream
from gyre_proxy.chat import ChatRequest, ExecutionAuth, Message, Role, StreamEvent, TextBlock
from gyre_proxy.engines.testing import FakeEngine
from gyre_proxy.exceptions import SpoolClosed
from gyre_proxy.harness import GenericHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, RecordSpool
from gyre_store import InMemoryEventLog, ModelCallRecorded
from gyre_store.catalog import CallFinish
from gyre_store.trees import TrajectoryRecorder

pytestmark = pytest.mark.anyio

AUTH = ExecutionAuth("ex", "run", "generic")
REQUEST = ChatRequest(system="You are an agent.", messages=(Message(Role.USER, (TextBlock("go"),)),))


class Client:
    """The ASGI side of one response: goes away once it has received ``after`` bodies."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.bodies = 0
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.bodies += 1
            if self.bodies >= self.after:
                self.gone.set()


def framing() -> StreamFraming[Any]:
    return StreamFraming(
        opening=lambda first: (b"open\n\n",),
        encode=lambda item: (b"data: x\n\n",),
        ping=b": ping\n\n",
        error=lambda err: b"event: error\n\n",
        finished=lambda: False,
    )


async def respond(source: AsyncIterator[Any], client: Client) -> None:
    pump, first = await open_stream(source, 5.0)
    response = SSEResponse(pump, first, framing(), 10.0, headers=SSE_HEADERS)
    await asyncio.wait_for(response({"type": "http"}, client.receive, client.send), 30)  # type: ignore[arg-type]


def pipeline_over(template: Qwen3Template, log: InMemoryEventLog) -> AnswerPipeline:
    tok = template.tok
    slow = FakeEngine(
        script=[tok.encode("one two three four five six seven eight")],
        step_delay_s=0.05,
        context_length=1_000_000,
    )
    recorder = TrajectoryRecorder(log)
    return AnswerPipeline(
        Ingestor(recorder, template, GenericHarness()),
        Router([("e", slow)]),
        RecordSpool(recorder),
    )


async def test_the_partial_record_of_an_answer_cut_short_reaches_the_store(template: Qwen3Template) -> None:
    log = InMemoryEventLog()
    pipeline = pipeline_over(template, log)
    await respond(pipeline.stream(AUTH, REQUEST), Client(after=3))
    assert pipeline.spool.flush(10)
    pipeline.spool.close()
    [cut] = [r.event for r in log.read(0) if isinstance(r.event, ModelCallRecorded)]
    assert cut.finish == CallFinish.ABORT and cut.request_id.endswith("-cut")


async def test_a_partial_record_that_cannot_be_spooled_is_logged_as_lost(
    template: Qwen3Template, caplog: pytest.LogCaptureFixture
) -> None:
    """The read in flight is cancelled; the answerer's cleanup fails inside it."""
    log = InMemoryEventLog()
    pipeline = pipeline_over(template, log)
    pipeline.spool.close()  # staging the partial record now raises SpoolClosed
    with caplog.at_level(logging.ERROR, logger="gyre_proxy.api.sse"):
        await respond(pipeline.stream(AUTH, REQUEST), Client(after=3))
    [error] = [r for r in caplog.records if r.name == "gyre_proxy.api.sse"]
    assert "may be lost" in error.getMessage() and "SpoolClosed" in error.getMessage()
    assert error.exc_info is not None and isinstance(error.exc_info[1], SpoolClosed)
    assert log.read(0) == []


async def test_a_cleanup_that_fails_when_the_stream_is_closed_between_reads_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No read in flight: closing the source itself runs the cleanup, and it fails."""
    release = asyncio.Event()

    async def source() -> AsyncIterator[StreamEvent | str]:
        try:
            yield "first"
            yield "second"  # the response is blocked sending it when the client goes away
            await asyncio.sleep(60)
        finally:
            release.set()
            raise SpoolClosed("record spool closed: the partial record is not taken")

    class SlowClient(Client):
        async def send(self, message: dict[str, Any]) -> None:
            await super().send(message)
            if self.gone.is_set():
                await asyncio.sleep(0.05)  # the disconnect watcher closes the pump meanwhile

    with caplog.at_level(logging.ERROR, logger="gyre_proxy.api.sse"):
        await respond(source(), SlowClient(after=1))
    assert release.is_set()
    [error] = [r for r in caplog.records if r.name == "gyre_proxy.api.sse"]
    assert isinstance(error.exc_info[1] if error.exc_info else None, SpoolClosed)
