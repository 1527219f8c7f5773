"""Anthropic Messages answers: the ``message`` object, and the SSE event sequence a stream
of ``StreamEvent``s becomes, in Anthropic's order.

Thinking blocks get a stable stand-in signature (harnesses send thinking back with it); a
tool call's input is sent as the JSON its arguments were sampled as. Requests and routes
are in ``anthropic``.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import msgspec

from gyre_proxy.api.errors import anthropic_error_body
from gyre_proxy.api.sse import named_event
from gyre_proxy.chat import (
    Block,
    BlockKind,
    BlockStart,
    BlockStop,
    ChatResponse,
    MessageDone,
    MessageStart,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
)
from gyre_proxy.exceptions import ApiError, InvalidRequest


def new_message_id() -> str:
    return "msg_" + secrets.token_urlsafe(18)


def thinking_signature(thinking: str) -> str:
    """A stable stand-in for Anthropic's signature: harnesses send thinking back with it."""
    return "gyre1." + hashlib.blake2b(thinking.encode(), digest_size=16).hexdigest()


def _raw_json_object(text: str) -> msgspec.Raw:
    try:
        msgspec.json.decode(text)
    except msgspec.DecodeError:
        return msgspec.Raw(b"{}")
    return msgspec.Raw(text.encode())


def content_block(block: Block) -> dict[str, Any]:
    """One content block of a message object, as the API answers it."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        signature = block.signature or thinking_signature(block.thinking)
        return {"type": "thinking", "thinking": block.thinking, "signature": signature}
    if isinstance(block, ToolUseBlock):
        return {
            "type": "tool_use",
            "id": block.id,
            "name": block.name,
            "input": _raw_json_object(block.input_json),
        }
    raise InvalidRequest("a tool_result block cannot be part of an answer")


def message_object(response: ChatResponse, *, message_id: str, model: str) -> dict[str, Any]:
    """The non-streaming answer: a ``message`` object."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [content_block(b) for b in response.blocks],
        "stop_reason": response.stop_reason.value,
        "stop_sequence": response.stop_sequence,
        "usage": _usage(response.input_tokens, response.output_tokens),
    }


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _sse(payload: dict[str, Any]) -> bytes:
    return named_event(str(payload["type"]), msgspec.json.encode(payload))


PING = _sse({"type": "ping"})


class StreamEncoder:
    """Turns the answerer's ``StreamEvent``s into Anthropic SSE events, in Anthropic's order.

    Block indices are renumbered from 0 in order of appearance, open blocks are closed before
    ``message_delta``, and a thinking block gets its ``signature_delta`` just before its stop.
    """

    def __init__(self, *, message_id: str, model: str) -> None:
        self.message_id = message_id
        self.model = model
        self.done = False
        self._wire: dict[int, int] = {}  # answerer's index -> wire index
        self._open: dict[int, BlockKind] = {}  # wire index -> kind, while open
        self._thinking: dict[int, list[str]] = {}

    def start(self, input_tokens: int) -> bytes:
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(input_tokens, 0),
        }
        return _sse({"type": "message_start", "message": message})

    def _stop(self, index: int) -> list[bytes]:
        out: list[bytes] = []
        if self._open.pop(index) is BlockKind.THINKING:
            signature = thinking_signature("".join(self._thinking.pop(index, [])))
            delta = {"type": "signature_delta", "signature": signature}
            out.append(_sse({"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(_sse({"type": "content_block_stop", "index": index}))
        return out

    def encode(self, event: StreamEvent) -> list[bytes]:
        if isinstance(event, MessageStart) or self.done:
            return []
        if isinstance(event, BlockStart):
            index = self._wire[event.index] = len(self._wire)
            self._open[index] = event.kind
            block: dict[str, Any] = {"type": "text", "text": ""}
            if event.kind is BlockKind.THINKING:
                block = {"type": "thinking", "thinking": "", "signature": ""}
                self._thinking[index] = []
            elif event.kind is BlockKind.TOOL_USE:
                block = {"type": "tool_use", "id": event.tool_use_id, "name": event.tool_name, "input": {}}
            return [_sse({"type": "content_block_start", "index": index, "content_block": block})]
        if isinstance(event, MessageDone):
            out = [frame for index in list(self._open) for frame in self._stop(index)]
            ending = {"stop_reason": event.stop_reason.value, "stop_sequence": event.stop_sequence}
            usage = {"input_tokens": event.input_tokens, "output_tokens": event.output_tokens}
            out.append(_sse({"type": "message_delta", "delta": ending, "usage": usage}))
            out.append(_sse({"type": "message_stop"}))
            self.done = True
            return out
        index = self._wire.get(event.index, -1)
        if index not in self._open:
            return []  # a delta or stop for a block that is not open: nothing valid to send
        if isinstance(event, BlockStop):
            return self._stop(index)
        if isinstance(event, TextDelta):
            delta: dict[str, str] = {"type": "text_delta", "text": event.text}
        elif isinstance(event, ThinkingDelta):
            self._thinking[index].append(event.thinking)
            delta = {"type": "thinking_delta", "thinking": event.thinking}
        else:
            delta = {"type": "input_json_delta", "partial_json": event.partial_json}
        return [_sse({"type": "content_block_delta", "index": index, "delta": delta})]


def error_event(err: ApiError) -> bytes:
    return named_event("error", anthropic_error_body(err))
