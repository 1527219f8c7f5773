"""The OpenAI Chat Completions API: ``POST /v1/chat/completions`` and ``GET /v1/models``.

Requests become a ``ChatRequest`` (system and developer messages join the system prompt,
consecutive ``tool`` messages become one user message of tool results); answers go out as a
``chat.completion`` or a stream of ``chat.completion.chunk``s ended by ``data: [DONE]``.
Reasoning travels as ``reasoning_content``, the field vLLM and SGLang use. Sampling options
the policy cannot honour (``n`` > 1 excepted, which is refused) are accepted and ignored.
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre_proxy.api.adapter import JSON, ApiSettings, authenticate, read_json
from gyre_proxy.api.errors import openai_error_body, openai_error_response
from gyre_proxy.api.sse import (
    COMMENT_PING,
    DATA_DONE,
    SSE_HEADERS,
    SSEResponse,
    StreamFraming,
    data_event,
    open_stream,
)
from gyre_proxy.chat import (
    Answerer,
    Block,
    BlockKind,
    BlockStart,
    ChatRequest,
    ChatResponse,
    KeyResolver,
    Message,
    MessageDone,
    Role,
    StopReason,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolInputDelta,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre_proxy.exceptions import InvalidRequest

SYSTEM_SEPARATOR = "\n\n"
TEXT_SEPARATOR = "\n\n"  # between text blocks that a tool call split, in the single content string
IMAGE_PLACEHOLDER = "[image omitted: this model reads text only]"
FINISH_REASONS = {
    StopReason.END_TURN: "stop",
    StopReason.STOP_SEQUENCE: "stop",
    StopReason.MAX_TOKENS: "length",
    StopReason.TOOL_USE: "tool_calls",
}

# -- the request as sent ------------------------------------------------------------------------


class _TextPart(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class _ImagePart(msgspec.Struct, tag_field="type", tag="image_url"):
    pass


_Content = str | list[_TextPart | _ImagePart] | None


class _Function(msgspec.Struct):
    name: str
    arguments: str = "{}"


class _ToolCall(msgspec.Struct):
    id: str
    function: _Function
    type: Literal["function"] = "function"


class _ChatMessage(msgspec.Struct):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: _Content = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class _FunctionDef(msgspec.Struct):
    name: str
    description: str = ""
    parameters: msgspec.Raw = msgspec.Raw(b"{}")


class _ToolDef(msgspec.Struct):
    function: _FunctionDef
    type: Literal["function"] = "function"


class _StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _TemplateOptions(msgspec.Struct):
    enable_thinking: bool | None = None


class CompletionsBody(msgspec.Struct):
    """The fields of a Chat Completions request gyre reads; unknown fields are ignored."""

    model: str
    messages: list[_ChatMessage]
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    stream: bool = False
    stream_options: _StreamOptions | None = None
    tools: list[_ToolDef] | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: _TemplateOptions | None = None


COMPLETIONS_DECODER = msgspec.json.Decoder(CompletionsBody)


def _text(content: _Content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.text if isinstance(p, _TextPart) else IMAGE_PLACEHOLDER for p in content)


def _assistant_blocks(m: _ChatMessage, tool_ids: set[str]) -> list[Block]:
    blocks: list[Block] = []
    if m.reasoning_content:
        blocks.append(ThinkingBlock(m.reasoning_content))
    if text := _text(m.content):
        blocks.append(TextBlock(text))
    for call in m.tool_calls or ():
        tool_ids.add(call.id)
        blocks.append(ToolUseBlock(call.id, call.function.name, call.function.arguments or "{}"))
    return blocks


def _thinking(body: CompletionsBody) -> bool:
    if body.chat_template_kwargs is not None and body.chat_template_kwargs.enable_thinking is not None:
        return body.chat_template_kwargs.enable_thinking
    return body.reasoning_effort in ("low", "medium", "high")


def to_chat_request(body: CompletionsBody) -> ChatRequest:
    """Translate a decoded request; ``InvalidRequest`` on what the API would refuse."""
    if not body.messages:
        raise InvalidRequest("messages: at least one message is required", param="messages")
    if body.n not in (None, 1):
        raise InvalidRequest("n: only n=1 is supported", param="n")
    system: list[str] = []
    messages: list[Message] = []
    results: list[Block] = []  # consecutive tool messages, waiting to become one user message
    tool_ids: set[str] = set()
    for i, m in enumerate(body.messages):
        if m.role != "tool" and results:
            messages.append(Message(Role.USER, tuple(results)))
            results = []
        if m.role in ("system", "developer"):
            system.append(_text(m.content))
        elif m.role == "user":
            messages.append(Message(Role.USER, (TextBlock(_text(m.content)),)))
        elif m.role == "assistant":
            messages.append(Message(Role.ASSISTANT, tuple(_assistant_blocks(m, tool_ids))))
        elif m.tool_call_id is None:
            raise InvalidRequest(
                f"messages[{i}].tool_call_id: required for role 'tool'", param=f"messages[{i}]"
            )
        elif m.tool_call_id not in tool_ids:
            raise InvalidRequest(
                f"messages[{i}]: messages with role 'tool' must be a response to a preceding message "
                f"with 'tool_calls' (no tool call has id {m.tool_call_id!r})",
                param=f"messages[{i}]",
            )
        else:
            results.append(ToolResultBlock(m.tool_call_id, _text(m.content)))
    if results:
        messages.append(Message(Role.USER, tuple(results)))
    if not messages:
        raise InvalidRequest("messages: at least one user or assistant message is required", param="messages")
    tools = tuple(
        ToolSpec(t.function.name, t.function.description, _compact_schema(t.function.parameters, k))
        for k, t in enumerate(body.tools or ())
    )
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    chat = ChatRequest(
        system=SYSTEM_SEPARATOR.join(system),
        messages=tuple(messages),
        tools=tools,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=stop,
        thinking=_thinking(body),
        model=body.model,
    )
    max_tokens = body.max_completion_tokens or body.max_tokens
    return chat if max_tokens is None else msgspec.structs.replace(chat, max_tokens=max_tokens)


def _compact_schema(raw: msgspec.Raw, k: int) -> str:
    text = bytes(raw).decode()
    if text == "null":
        return "{}"
    if not text.startswith("{"):
        raise InvalidRequest(f"tools[{k}].function.parameters: must be a JSON object", param=f"tools[{k}]")
    return msgspec.json.encode(msgspec.json.decode(text)).decode()


# -- the answer ---------------------------------------------------------------------------------


def new_completion_id() -> str:
    return "chatcmpl-" + secrets.token_urlsafe(18)


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }


def completion_object(
    response: ChatResponse, *, completion_id: str, model: str, created: int
) -> dict[str, Any]:
    """The non-streaming answer: a ``chat.completion`` object."""
    texts = [b.text for b in response.blocks if isinstance(b, TextBlock)]
    message: dict[str, Any] = {"role": "assistant", "content": TEXT_SEPARATOR.join(texts) if texts else None}
    reasoning = "".join(b.thinking for b in response.blocks if isinstance(b, ThinkingBlock))
    if reasoning:
        message["reasoning_content"] = reasoning
    calls = [b for b in response.blocks if isinstance(b, ToolUseBlock)]
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.input_json}}
            for c in calls
        ]
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": FINISH_REASONS[response.stop_reason],
        "logprobs": None,
    }
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(response.input_tokens, response.output_tokens),
    }


class ChunkEncoder:
    """Turns the answerer's ``StreamEvent``s into ``chat.completion.chunk`` SSE events."""

    def __init__(self, *, completion_id: str, model: str, created: int, include_usage: bool) -> None:
        self._head = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage
        self._tool_index: dict[int, int] = {}  # answerer's block index -> tool_calls index
        self._texts = 0
        self.done = False

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        payload: dict[str, Any] = {**self._head, "choices": [choice]}
        if self._include_usage:
            payload["usage"] = None
        return data_event(msgspec.json.encode(payload))

    def start(self) -> bytes:
        return self.chunk({"role": "assistant", "content": ""})

    def encode(self, event: StreamEvent) -> list[bytes]:
        if self.done:
            return []
        if isinstance(event, BlockStart):
            if event.kind is BlockKind.TEXT:
                self._texts += 1
                return [self.chunk({"content": TEXT_SEPARATOR})] if self._texts > 1 else []
            if event.kind is BlockKind.TOOL_USE:
                index = self._tool_index[event.index] = len(self._tool_index)
                function = {"name": event.tool_name, "arguments": ""}
                call = {"index": index, "id": event.tool_use_id, "type": "function", "function": function}
                return [self.chunk({"tool_calls": [call]})]
            return []
        if isinstance(event, TextDelta):
            return [self.chunk({"content": event.text})]
        if isinstance(event, ThinkingDelta):
            return [self.chunk({"reasoning_content": event.thinking})]
        if isinstance(event, ToolInputDelta) and event.index in self._tool_index:
            call = {"index": self._tool_index[event.index], "function": {"arguments": event.partial_json}}
            return [self.chunk({"tool_calls": [call]})]
        if isinstance(event, MessageDone):
            self.done = True
            out = [self.chunk({}, FINISH_REASONS[event.stop_reason])]
            if self._include_usage:
                usage = {
                    **self._head,
                    "choices": [],
                    "usage": _usage(event.input_tokens, event.output_tokens),
                }
                out.append(data_event(msgspec.json.encode(usage)))
            return [*out, DATA_DONE]
        return []


# -- the routes ---------------------------------------------------------------------------------


def routes(answerer: Answerer, keys: KeyResolver, settings: ApiSettings) -> list[Route]:
    """``/v1/chat/completions`` and ``/v1/models`` over ``answerer``."""

    async def completions(request: Request) -> Response:
        try:
            execution = await authenticate(request, keys)
            body = await read_json(request, COMPLETIONS_DECODER, settings)
            chat = request.state.chat_request = to_chat_request(body)
            completion_id, created = new_completion_id(), int(time.time())
            if not body.stream:
                response = await answerer.complete(execution, chat)
                answer = completion_object(
                    response, completion_id=completion_id, model=body.model, created=created
                )
                return Response(msgspec.json.encode(answer), media_type=JSON)
            pump, first = await open_stream(answerer.stream(execution, chat), settings.stream_start_timeout_s)
        except Exception as exc:
            return openai_error_response(exc)
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        encoder = ChunkEncoder(
            completion_id=completion_id, model=body.model, created=created, include_usage=include_usage
        )
        framing = StreamFraming[StreamEvent](
            opening=lambda first: (encoder.start(),),
            encode=encoder.encode,
            ping=COMMENT_PING,
            error=lambda err: data_event(openai_error_body(err)),
            finished=lambda: encoder.done,
        )
        return SSEResponse(pump, first, framing, settings.ping_interval_s, headers=SSE_HEADERS)

    async def models(request: Request) -> Response:
        try:
            await authenticate(request, keys)
        except Exception as exc:
            return openai_error_response(exc)
        if "anthropic-version" in request.headers:  # the Anthropic SDK's models.list()
            entry = {"type": "model", "id": settings.model_name, "display_name": settings.model_name}
            listing: dict[str, Any] = {
                "data": [{**entry, "created_at": "1970-01-01T00:00:00Z"}],
                "has_more": False,
                "first_id": settings.model_name,
                "last_id": settings.model_name,
            }
        else:
            model = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "gyre"}
            listing = {"object": "list", "data": [model]}
        return Response(msgspec.json.encode(listing), media_type=JSON)

    return [
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]
