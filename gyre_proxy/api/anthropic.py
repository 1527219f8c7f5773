"""The Anthropic Messages API: ``POST /v1/messages`` (streaming or not) and ``count_tokens``.

Requests are validated strictly and translated into a ``ChatRequest``; the answerer's
``ChatResponse`` or ``StreamEvent``s go back out as a message object or the full SSE event
sequence (``anthropic_answer``). Fields the policy cannot honour (``cache_control``, ``output_config``,
``context_management``, ``metadata``, ``tool_choice``, ...) are accepted and ignored; the raw
body stays on ``request.state.raw_body``. Images become a text placeholder.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre_proxy.api.adapter import JSON, ApiSettings, authenticate, read_json
from gyre_proxy.api.anthropic_answer import PING, StreamEncoder, error_event, message_object, new_message_id
from gyre_proxy.api.errors import anthropic_error_response
from gyre_proxy.api.sse import (
    SSE_HEADERS,
    SSEResponse,
    StreamFraming,
    open_stream,
)
from gyre_proxy.chat import (
    Answerer,
    Block,
    ChatRequest,
    KeyResolver,
    Message,
    MessageStart,
    Role,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre_proxy.exceptions import InvalidRequest

SYSTEM_SEPARATOR = "\n\n"  # between system blocks and folded role:"system" messages
IMAGE_PLACEHOLDER = "[image omitted: this model reads text only]"

# -- the request as sent ------------------------------------------------------------------------


class _Text(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class _Image(msgspec.Struct, tag_field="type", tag="image"):
    pass


class _Thinking(msgspec.Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str = ""


class _RedactedThinking(msgspec.Struct, tag_field="type", tag="redacted_thinking"):
    pass


class _ToolUse(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: msgspec.Raw


class _ToolResult(msgspec.Struct, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[_Text | _Image] = ""
    is_error: bool = False


_Content = _Text | _Image | _Thinking | _RedactedThinking | _ToolUse | _ToolResult


class _Message(msgspec.Struct):
    role: Literal["user", "assistant", "system"]
    content: str | list[_Content]


class _Tool(msgspec.Struct):
    name: str
    description: str = ""
    input_schema: msgspec.Raw = msgspec.Raw(b"{}")


class _ThinkingConfig(msgspec.Struct):
    type: str


class MessagesBody(msgspec.Struct):
    """The fields of a Messages request gyre reads; unknown fields are ignored."""

    model: str
    messages: list[_Message]
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    system: str | list[_Text] | None = None
    tools: list[_Tool] | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    thinking: _ThinkingConfig | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False


MESSAGES_DECODER = msgspec.json.Decoder(MessagesBody)


def _result_text(content: str | list[_Text | _Image]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.text if isinstance(p, _Text) else IMAGE_PLACEHOLDER for p in content)


def _json_object(raw: msgspec.Raw, where: str) -> str:
    text = bytes(raw).decode()
    if not text.startswith("{"):
        raise InvalidRequest(f"{where}: must be a JSON object")
    return text


def _arguments(raw: msgspec.Raw, where: str) -> str:
    """A tool call's ``input`` object as Qwen3's template writes arguments given as an object
    (``json.dumps``: ``", "`` and ``": "``, keys in order); a call the proxy itself generated
    gets its sampled text back from the payload cache before it is rendered."""
    return json.dumps(json.loads(_json_object(raw, where)), ensure_ascii=False)


def _blocks(role: str, content: list[_Content], at: str, tool_ids: set[str]) -> list[Block]:
    blocks: list[Block] = []
    for j, part in enumerate(content):
        where = f"{at}.content.{j}"
        if isinstance(part, _Text):
            blocks.append(TextBlock(part.text))
        elif isinstance(part, _Image):
            blocks.append(TextBlock(IMAGE_PLACEHOLDER))
        elif isinstance(part, _RedactedThinking):
            continue  # opaque to a non-Anthropic model
        elif role != "assistant" and isinstance(part, _Thinking | _ToolUse):
            raise InvalidRequest(
                f"{where}: a {role} message cannot hold a {part.__struct_config__.tag} block"
            )
        elif isinstance(part, _Thinking):
            blocks.append(ThinkingBlock(part.thinking, part.signature))
        elif isinstance(part, _ToolUse):
            tool_ids.add(part.id)
            blocks.append(ToolUseBlock(part.id, part.name, _arguments(part.input, f"{where}.input")))
        elif role != "user":
            raise InvalidRequest(f"{where}: tool_result blocks belong in user messages")
        elif part.tool_use_id not in tool_ids:
            raise InvalidRequest(
                f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: {part.tool_use_id}. "
                "Each `tool_result` block must have a corresponding `tool_use` block in an earlier message."
            )
        else:
            blocks.append(ToolResultBlock(part.tool_use_id, _result_text(part.content), part.is_error))
    return blocks


def to_chat_request(body: MessagesBody, *, require_max_tokens: bool = True) -> ChatRequest:
    """Translate a decoded Messages request; ``InvalidRequest`` on what the API would refuse."""
    if require_max_tokens and body.max_tokens is None:
        raise InvalidRequest("max_tokens: Field required")
    if not body.messages:
        raise InvalidRequest("messages: at least one message is required")
    system: list[str] = []
    if isinstance(body.system, str):
        system.append(body.system)
    elif body.system is not None:
        system.extend(b.text for b in body.system)
    messages: list[Message] = []
    tool_ids: set[str] = set()
    last = len(body.messages) - 1
    for i, m in enumerate(body.messages):
        at = f"messages.{i}"
        if isinstance(m.content, str):
            content: list[_Content] = [_Text(m.content)]
        elif not m.content and not (i == last and m.role == "assistant"):
            raise InvalidRequest(
                f"{at}: all messages must have non-empty content except the final assistant message"
            )
        else:
            content = m.content
        if m.role == "system":
            # Claude Code sends some system text as role:"system" messages: it joins the system prompt.
            if not all(isinstance(p, _Text) for p in content):
                raise InvalidRequest(f"{at}: system messages may hold only text blocks")
            # The blocks of one message are its text in pieces: the same text sent as a string
            # must give the same system prompt (and so the same agent and stored prefix).
            system.append("".join(p.text for p in content if isinstance(p, _Text)))
            continue
        messages.append(Message(Role(m.role), tuple(_blocks(m.role, content, at, tool_ids))))
    if not messages:
        raise InvalidRequest("messages: at least one user or assistant message is required")
    tools = tuple(
        ToolSpec(t.name, t.description, _compact_schema(t.input_schema, f"tools.{k}"))
        for k, t in enumerate(body.tools or ())
    )
    chat = ChatRequest(
        system=SYSTEM_SEPARATOR.join(system),
        messages=tuple(messages),
        tools=tools,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=tuple(body.stop_sequences or ()),
        thinking=body.thinking is not None and body.thinking.type in ("enabled", "adaptive"),
        model=body.model,
    )
    return chat if body.max_tokens is None else msgspec.structs.replace(chat, max_tokens=body.max_tokens)


def _compact_schema(raw: msgspec.Raw, where: str) -> str:
    if bytes(raw).strip() == b"null":
        return "{}"
    return msgspec.json.encode(msgspec.json.decode(_json_object(raw, f"{where}.input_schema"))).decode()


# -- the routes ---------------------------------------------------------------------------------


def routes(answerer: Answerer, keys: KeyResolver, settings: ApiSettings) -> list[Route]:
    """``/v1/messages`` and ``/v1/messages/count_tokens`` over ``answerer``."""

    async def parse(request: Request, *, require_max_tokens: bool) -> tuple[MessagesBody, ChatRequest]:
        body = await read_json(request, MESSAGES_DECODER, settings)
        chat = to_chat_request(body, require_max_tokens=require_max_tokens)
        request.state.chat_request = chat
        return body, chat

    async def messages(request: Request) -> Response:
        try:
            execution = await authenticate(request, keys)
            body, chat = await parse(request, require_max_tokens=True)
            encoder = StreamEncoder(message_id=new_message_id(), model=body.model)
            if not body.stream:
                response = await answerer.complete(execution, chat)
                answer = message_object(response, message_id=encoder.message_id, model=body.model)
                return Response(msgspec.json.encode(answer), media_type=JSON)
            pump, first = await open_stream(answerer.stream(execution, chat), settings.stream_start_timeout_s)
        except Exception as exc:
            return anthropic_error_response(exc)
        framing = StreamFraming[StreamEvent](
            opening=lambda first: (
                encoder.start(first.input_tokens if isinstance(first, MessageStart) else 0),
                PING,
            ),
            encode=encoder.encode,
            ping=PING,
            error=error_event,
            finished=lambda: encoder.done,
        )
        return SSEResponse(pump, first, framing, settings.ping_interval_s, headers=SSE_HEADERS)

    async def count_tokens(request: Request) -> Response:
        try:
            execution = await authenticate(request, keys)
            _, chat = await parse(request, require_max_tokens=False)
            count = await answerer.count_tokens(execution, chat)
        except Exception as exc:
            return anthropic_error_response(exc)
        return Response(msgspec.json.encode({"input_tokens": count}), media_type=JSON)

    return [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    ]
