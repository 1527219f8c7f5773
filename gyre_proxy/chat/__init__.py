"""The proxy's own chat vocabulary: requests, messages and answers as the adapters translate
them, the stream events an answer is sent as, and the ``Answerer`` seam between the HTTP
APIs and the engine-side work. Plain values and protocols only: no tokens, no engines, no
HTTP. ``gyre_proxy.chat.testing`` has the scripted ``FakeAnswerer`` and ``StaticKeys``.
"""

from __future__ import annotations

from gyre_proxy.chat.answerer import (
    ENGINE_WAIT,
    Answerer,
    BlockKind,
    BlockStart,
    BlockStop,
    EngineWait,
    ExecutionAuth,
    KeyResolver,
    MessageDone,
    MessageStart,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolInputDelta,
)
from gyre_proxy.chat.evaluations import EvaluationAnswer, EvaluationAsked, EvaluationGateway
from gyre_proxy.chat.messages import (
    Block,
    ChatRequest,
    ChatResponse,
    Message,
    Role,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    canonical,
    chain_hashes,
    system_message,
    system_sha,
)

__all__ = [
    "ENGINE_WAIT",
    "Answerer",
    "Block",
    "BlockKind",
    "BlockStart",
    "BlockStop",
    "ChatRequest",
    "ChatResponse",
    "EngineWait",
    "EvaluationAnswer",
    "EvaluationAsked",
    "EvaluationGateway",
    "ExecutionAuth",
    "KeyResolver",
    "Message",
    "MessageDone",
    "MessageStart",
    "Role",
    "StopReason",
    "StreamEvent",
    "TextBlock",
    "TextDelta",
    "ThinkingBlock",
    "ThinkingDelta",
    "ToolInputDelta",
    "ToolResultBlock",
    "ToolSpec",
    "ToolUseBlock",
    "canonical",
    "chain_hashes",
    "system_message",
    "system_sha",
]
