"""In-memory stand-ins for the API adapters' two seams: a scripted ``Answerer`` and a
static ``KeyResolver``.

``FakeAnswerer`` answers each call with the next scripted reply, records every request and
whether each stream ran to its end or was closed early, so adapter tests need no engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from gyre_proxy.chat.answerer import (
    BlockKind,
    BlockStart,
    BlockStop,
    ExecutionAuth,
    MessageDone,
    MessageStart,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolInputDelta,
)
from gyre_proxy.chat.messages import (
    ChatRequest,
    ChatResponse,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)

KEY = "sk-test-execution-1"
EXECUTION = ExecutionAuth(execution_id="exec-1", run_id="run-1", harness="test")


@dataclass(frozen=True)
class Scripted:
    """A stream reply: events, with floats as pauses (seconds) and exceptions raised in place."""

    items: Sequence[StreamEvent | float | Exception]


Reply = ChatResponse | Scripted | Exception


def response_events(response: ChatResponse, *, chunk: int = 3) -> list[StreamEvent]:
    """The stream a real answerer would send for ``response``, text cut into ``chunk``-char deltas."""
    events: list[StreamEvent] = [MessageStart(response.input_tokens)]
    for i, block in enumerate(response.blocks):
        if isinstance(block, TextBlock):
            events.append(BlockStart(i, BlockKind.TEXT))
            events += [TextDelta(i, block.text[k : k + chunk]) for k in range(0, len(block.text), chunk)]
        elif isinstance(block, ThinkingBlock):
            events.append(BlockStart(i, BlockKind.THINKING))
            events += [
                ThinkingDelta(i, block.thinking[k : k + chunk]) for k in range(0, len(block.thinking), chunk)
            ]
        elif isinstance(block, ToolUseBlock):
            events.append(BlockStart(i, BlockKind.TOOL_USE, tool_use_id=block.id, tool_name=block.name))
            events += [
                ToolInputDelta(i, block.input_json[k : k + chunk])
                for k in range(0, len(block.input_json), chunk)
            ]
        events.append(BlockStop(i))
    events.append(
        MessageDone(
            response.stop_reason, response.input_tokens, response.output_tokens, response.stop_sequence
        )
    )
    return events


def text_reply(text: str, *, input_tokens: int = 11, output_tokens: int = 7) -> ChatResponse:
    return ChatResponse(
        blocks=(TextBlock(text),),
        stop_reason=StopReason.END_TURN,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


def tool_reply(tool_id: str, name: str, input_json: str, *, preface: str = "") -> ChatResponse:
    blocks = ((TextBlock(preface),) if preface else ()) + (ToolUseBlock(tool_id, name, input_json),)
    return ChatResponse(blocks=blocks, stop_reason=StopReason.TOOL_USE, input_tokens=20, output_tokens=9)


@dataclass
class FakeAnswerer:
    """A ``Answerer`` that plays ``replies`` in order (the last one repeats)."""

    replies: list[Reply]
    token_count: int = 42
    requests: list[ChatRequest] = field(default_factory=list)
    executions: list[ExecutionAuth] = field(default_factory=list)
    stream_endings: list[str] = field(default_factory=list)  # "completed" or "closed", per stream
    closed: threading.Event = field(default_factory=threading.Event)  # set when a stream is closed early

    def _next(self, execution: ExecutionAuth, request: ChatRequest) -> Reply:
        self.executions.append(execution)
        self.requests.append(request)
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

    async def complete(self, execution: ExecutionAuth, request: ChatRequest) -> ChatResponse:
        reply = self._next(execution, request)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, Scripted):
            raise TypeError("a Scripted reply can only answer a stream")
        return reply

    async def stream(self, execution: ExecutionAuth, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        reply = self._next(execution, request)
        items: Sequence[StreamEvent | float | Exception]
        if isinstance(reply, Exception):
            items = [reply]
        elif isinstance(reply, Scripted):
            items = reply.items
        else:
            items = response_events(reply)
        try:
            for item in items:
                if isinstance(item, float):
                    await asyncio.sleep(item)
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        except (GeneratorExit, asyncio.CancelledError):
            self.stream_endings.append("closed")
            self.closed.set()
            raise
        self.stream_endings.append("completed")

    async def count_tokens(self, execution: ExecutionAuth, request: ChatRequest) -> int:
        self._next(execution, request)
        return self.token_count


@dataclass
class StaticKeys:
    """A ``KeyResolver`` over a fixed table."""

    table: dict[str, ExecutionAuth] = field(default_factory=lambda: {KEY: EXECUTION})

    async def resolve(self, api_key: str) -> ExecutionAuth | None:
        return self.table.get(api_key)
