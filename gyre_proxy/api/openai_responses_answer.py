"""OpenAI Responses answers: the ``response`` object, and the SSE event sequence a stream of
``StreamEvent``s becomes, in the order Codex and the ``openai`` SDK parse.

Thinking becomes a ``reasoning`` item whose summary is the thinking text; with
``include: ["reasoning.encrypted_content"]`` the item also carries ``encrypted_content``,
the sampled thinking text encoded (not encrypted: ``gyre1.`` and base64url), which restores
it exactly when the client sends the item back. Tool calls keep the policy's call id as
``call_id``; freeform and namespaced tools are mapped back through the ``ToolCatalog``.
The request side and the route are in ``openai_responses``.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gyre_proxy.api.sse import named_event
from gyre_proxy.chat import (
    Block,
    BlockKind,
    BlockStart,
    BlockStop,
    ChatResponse,
    MessageDone,
    MessageStart,
    StopReason,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolInputDelta,
    ToolUseBlock,
)
from gyre_proxy.exceptions import ApiError, InvalidRequest

REASONING_PREFIX = "gyre1."
CUSTOM_INPUT = "input"  # the one string parameter a freeform tool becomes for the policy


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(16)


def _item_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def encode_reasoning(thinking: str) -> str:
    """The ``encrypted_content`` of a reasoning item: the thinking text, encoded."""
    return REASONING_PREFIX + base64.urlsafe_b64encode(thinking.encode()).decode()


def decode_reasoning(value: object, at: str) -> str | None:
    """The thinking text in an ``encrypted_content`` this server wrote; None when absent."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith(REASONING_PREFIX):
        raise InvalidRequest(f"{at}.encrypted_content: not written by this server", param=at)
    try:
        return base64.urlsafe_b64decode(value[len(REASONING_PREFIX) :].encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest(f"{at}.encrypted_content: corrupted", param=at) from exc


@dataclass(frozen=True)
class ResponseHead:
    """What every answer to one request repeats: ids, the model, the echoed settings, and how
    the policy's tool names map back to the request's tools."""

    response_id: str
    created_at: int
    model: str
    catalog_custom: frozenset[str]
    wire_name: Callable[[str], tuple[str, str | None]]
    encrypted_reasoning: bool
    echo: dict[str, Any] = field(default_factory=dict)

    def response(self, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.model,
            "output": output,
            "usage": None,
            **self.echo,
            **extra,
        }


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    # The reasoning part of the output is not counted separately (reported as 0).
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _ending(
    head: ResponseHead, stop: StopReason, output: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    if stop is StopReason.MAX_TOKENS:
        return head.response(
            "incomplete", output, usage=usage, incomplete_details={"reason": "max_output_tokens"}
        )
    return head.response("completed", output, usage=usage)


# -- items ------------------------------------------------------------------------------------------


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status == "completed"
        else []
    )
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_item(head: ResponseHead, item_id: str, thinking: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
    if thinking is not None:
        item["summary"] = [{"type": "summary_text", "text": thinking}]
        item["encrypted_content"] = encode_reasoning(thinking) if head.encrypted_reasoning else None
    return item


def custom_input(arguments: str) -> str:
    """A freeform tool's input from the arguments the policy sampled (``{"input": "..."}``);
    arguments of another shape are passed on as they are."""
    try:
        args = msgspec.json.decode(arguments)
    except msgspec.DecodeError:
        return arguments
    if isinstance(args, dict) and isinstance(args.get(CUSTOM_INPUT), str):
        return str(args[CUSTOM_INPUT])
    return arguments


def call_item(
    head: ResponseHead, item_id: str, call_id: str, policy_name: str, arguments: str | None
) -> dict[str, Any]:
    """A ``function_call`` or ``custom_tool_call`` item; ``arguments`` None while it is open."""
    status = "in_progress" if arguments is None else "completed"
    if policy_name in head.catalog_custom:
        text = "" if arguments is None else custom_input(arguments)
        return {"id": item_id, "type": "custom_tool_call", "status": status, "call_id": call_id,
                "name": policy_name, "input": text}  # fmt: skip
    name, namespace = head.wire_name(policy_name)
    item: dict[str, Any] = {"id": item_id, "type": "function_call", "status": status, "call_id": call_id,
                            "name": name, "arguments": arguments or ""}  # fmt: skip
    if namespace is not None:
        item["namespace"] = namespace
    return item


def _items(head: ResponseHead, blocks: tuple[Block, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, TextBlock):
            out.append(message_item(_item_id("msg_"), b.text))
        elif isinstance(b, ThinkingBlock):
            out.append(reasoning_item(head, _item_id("rs_"), b.thinking))
        elif isinstance(b, ToolUseBlock):
            out.append(call_item(head, _item_id("fc_"), b.id, b.name, b.input_json))
    return out


def response_object(head: ResponseHead, response: ChatResponse) -> dict[str, Any]:
    """The non-streaming answer: a ``response`` object."""
    usage = _usage(response.input_tokens, response.output_tokens)
    return _ending(head, response.stop_reason, _items(head, response.blocks), usage)


# -- the stream -------------------------------------------------------------------------------------


@dataclass
class _Open:
    output_index: int
    item_id: str
    kind: BlockKind
    call_id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)


class ResponseEncoder:
    """Turns the answerer's ``StreamEvent``s into Responses SSE events.

    Every event carries a ``sequence_number``; each block becomes one output item, opened with
    ``response.output_item.added`` and closed with ``response.output_item.done`` (open items
    are closed before the final ``response.completed``)."""

    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self.done = False
        self.output: list[dict[str, Any]] = []
        self._seq = 0
        self._open: dict[int, _Open] = {}

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return named_event(kind, msgspec.json.encode(payload))

    def start(self) -> list[bytes]:
        response = self.head.response("in_progress", [])
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def _begin(self, event: BlockStart) -> list[bytes]:
        index = len(self.output)
        if event.kind is BlockKind.TEXT:
            o = _Open(index, _item_id("msg_"), event.kind)
            item = message_item(o.item_id, "", "in_progress")
        elif event.kind is BlockKind.THINKING:
            o = _Open(index, _item_id("rs_"), event.kind)
            item = reasoning_item(self.head, o.item_id, None)
        else:
            o = _Open(index, _item_id("fc_"), event.kind, event.tool_use_id, event.tool_name)
            item = call_item(self.head, o.item_id, o.call_id, o.name, None)
        self._open[event.index] = o
        self.output.append(item)
        out = [self._event("response.output_item.added", output_index=index, item=item)]
        where = {"item_id": o.item_id, "output_index": index}
        if event.kind is BlockKind.TEXT:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._event("response.content_part.added", **where, content_index=0, part=part))
        elif event.kind is BlockKind.THINKING:
            part = {"type": "summary_text", "text": ""}
            out.append(
                self._event("response.reasoning_summary_part.added", **where, summary_index=0, part=part)
            )
        return out

    def _delta(self, o: _Open, event: TextDelta | ThinkingDelta | ToolInputDelta) -> list[bytes]:
        where = {"item_id": o.item_id, "output_index": o.output_index}
        if isinstance(event, TextDelta) and o.kind is BlockKind.TEXT:
            o.parts.append(event.text)
            return [
                self._event(
                    "response.output_text.delta", **where, content_index=0, delta=event.text, logprobs=[]
                )
            ]
        if isinstance(event, ThinkingDelta) and o.kind is BlockKind.THINKING:
            o.parts.append(event.thinking)
            return [
                self._event(
                    "response.reasoning_summary_text.delta", **where, summary_index=0, delta=event.thinking
                )
            ]
        if isinstance(event, ToolInputDelta) and o.kind is BlockKind.TOOL_USE:
            o.parts.append(event.partial_json)
            if o.name in self.head.catalog_custom:
                return []  # a freeform input is known only once its arguments are complete
            return [self._event("response.function_call_arguments.delta", **where, delta=event.partial_json)]
        return []

    def _finish(self, o: _Open) -> list[bytes]:
        text = "".join(o.parts)
        where = {"item_id": o.item_id, "output_index": o.output_index}
        out: list[bytes] = []
        if o.kind is BlockKind.TEXT:
            item = message_item(o.item_id, text)
            part = item["content"][0]
            out.append(
                self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            )
            out.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        elif o.kind is BlockKind.THINKING:
            item = reasoning_item(self.head, o.item_id, text)
            part = {"type": "summary_text", "text": text}
            out.append(
                self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=text)
            )
            out.append(
                self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=part)
            )
        else:
            item = call_item(self.head, o.item_id, o.call_id, o.name, text or "{}")
            if item["type"] == "custom_tool_call":
                out.append(self._event("response.custom_tool_call_input.delta", **where, delta=item["input"]))
                out.append(self._event("response.custom_tool_call_input.done", **where, input=item["input"]))
            else:
                out.append(self._event("response.function_call_arguments.done", **where,
                                       name=item["name"], arguments=item["arguments"]))  # fmt: skip
        self.output[o.output_index] = item
        out.append(self._event("response.output_item.done", output_index=o.output_index, item=item))
        return out

    def encode(self, event: StreamEvent) -> list[bytes]:
        if isinstance(event, MessageStart) or self.done:
            return []
        if isinstance(event, BlockStart):
            return self._begin(event)
        if isinstance(event, MessageDone):
            out = [frame for o in list(self._open.values()) for frame in self._finish(o)]
            self._open.clear()
            usage = _usage(event.input_tokens, event.output_tokens)
            response = _ending(self.head, event.stop_reason, self.output, usage)
            self.done = True
            kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            return [*out, self._event(kind, response=response)]
        o = self._open.get(event.index)
        if o is None:
            return []  # a delta or stop for a block that is not open: nothing valid to send
        if isinstance(event, BlockStop):
            del self._open[event.index]
            return self._finish(o)
        return self._delta(o, event)

    def fail(self, err: ApiError) -> list[bytes]:
        """An ``error`` event, then ``response.failed`` with what was sent so far; the stream ends."""
        code = err.openai_code or err.openai_type
        self.done = True
        failed = self.head.response("failed", self.output, error={"code": code, "message": err.message})
        return [
            self._event("error", code=code, message=err.message, param=err.param),
            self._event("response.failed", response=failed),
        ]
