"""The seam between the harness-facing APIs and the proxy's engine-side work.

The Anthropic and OpenAI adapters translate HTTP into a ``ChatRequest`` and call an
``Answerer``; the answerer (``gyre_proxy.answer.AnswerPipeline``) tokenizes, routes,
generates, records TITO and answers with a ``ChatResponse`` or a stream of
``StreamEvent``s. Adapters never see tokens or engines.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Protocol

import msgspec

from gyre_proxy.chat.messages import ChatRequest, ChatResponse, StopReason


class BlockKind(enum.StrEnum):
    TEXT = "text"
    THINKING = "thinking"
    TOOL_USE = "tool_use"


class MessageStart(msgspec.Struct, frozen=True, tag="message_start"):
    """Optional first event: the prompt is tokenized and admitted (adapters report its size)."""

    input_tokens: int


class BlockStart(msgspec.Struct, frozen=True, tag="block_start"):
    index: int
    kind: BlockKind
    tool_use_id: str = ""
    tool_name: str = ""


class TextDelta(msgspec.Struct, frozen=True, tag="text_delta"):
    index: int
    text: str


class ThinkingDelta(msgspec.Struct, frozen=True, tag="thinking_delta"):
    index: int
    thinking: str


class ToolInputDelta(msgspec.Struct, frozen=True, tag="tool_input_delta"):
    index: int
    partial_json: str


class BlockStop(msgspec.Struct, frozen=True, tag="block_stop"):
    index: int


class MessageDone(msgspec.Struct, frozen=True, tag="message_done"):
    stop_reason: StopReason
    input_tokens: int
    output_tokens: int
    stop_sequence: str | None = None


StreamEvent = MessageStart | BlockStart | TextDelta | ThinkingDelta | ToolInputDelta | BlockStop | MessageDone


class ExecutionAuth(msgspec.Struct, frozen=True):
    """The execution an API key belongs to; a key writes into exactly one execution."""

    execution_id: str
    run_id: str
    harness: str


class Answerer(Protocol):
    """Answers a harness's model calls; ``stream`` ends with ``MessageDone``, and closing it
    early stops the answer (the engine request is aborted)."""

    async def complete(self, execution: ExecutionAuth, request: ChatRequest) -> ChatResponse: ...

    def stream(self, execution: ExecutionAuth, request: ChatRequest) -> AsyncIterator[StreamEvent]: ...

    async def count_tokens(self, execution: ExecutionAuth, request: ChatRequest) -> int: ...


class EngineWait:
    """Seconds one request has spent waiting on engines so far: the answerer adds each wait
    on an engine's stream as it ends, and the HTTP layer takes the sum off its own time on
    the request (the ``x-gyre-overhead-duration-ms`` header, ``service/metrics.py``)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0


# The request's ``EngineWait``, set by the HTTP layer around each request (None: nobody counts).
ENGINE_WAIT: ContextVar[EngineWait | None] = ContextVar("gyre_engine_wait", default=None)


class KeyResolver(Protocol):
    """Maps an API key to its execution, or None for an unknown or revoked key."""

    async def resolve(self, api_key: str) -> ExecutionAuth | None: ...
