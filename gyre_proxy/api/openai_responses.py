"""The OpenAI Responses API, request side: ``POST /v1/responses`` as Codex and the ``openai``
SDK send it, translated into a ``ChatRequest``; the routes are here too.

``instructions`` and the developer and system messages before the first user or assistant
item are the system prompt; a developer or system message later in the history stays a
system turn where it was. Consecutive output items (reasoning, assistant messages, function
and custom tool calls) are one assistant message, consecutive tool outputs one user message
of tool results. Function tools, freeform (``custom``) tools and ``namespace`` groups become
the policy's function tools (``ToolCatalog``); hosted tools (web search and the like) cannot
be served by the policy and are left out. No response is stored: ``previous_response_id`` is
refused, the whole history comes with every request. Answers are in ``openai_responses_answer``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre_proxy.api.adapter import JSON, ApiSettings, authenticate, read_json
from gyre_proxy.api.errors import openai_error_response
from gyre_proxy.api.openai_responses_answer import (
    CUSTOM_INPUT,
    ResponseEncoder,
    ResponseHead,
    decode_reasoning,
    new_response_id,
    response_object,
)
from gyre_proxy.api.sse import SSE_HEADERS, SSEResponse, StreamFraming, open_stream
from gyre_proxy.chat import (
    Answerer,
    Block,
    ChatRequest,
    KeyResolver,
    Message,
    Role,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre_proxy.exceptions import InvalidRequest

SYSTEM_SEPARATOR = "\n\n"
THINKING_EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})
ENCRYPTED_REASONING = "reasoning.encrypted_content"
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
UNSUPPORTED_PARTS = frozenset({"input_image", "input_file", "input_audio"})
ITEM_TYPES = (
    "message",
    "reasoning",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
)

# -- the request as sent ------------------------------------------------------------------------


class _Reasoning(msgspec.Struct):
    effort: str | None = None
    summary: str | None = None


class _TemplateOptions(msgspec.Struct):
    enable_thinking: bool | None = None


class ResponsesBody(msgspec.Struct):
    """The fields of a Responses request gyre reads; other fields are accepted and ignored."""

    model: str = ""
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: _Reasoning | None = None
    include: list[str] | None = None
    store: bool | None = None
    stream: bool = False
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: _TemplateOptions | None = None


RESPONSES_DECODER = msgspec.json.Decoder(ResponsesBody)


@dataclass(frozen=True)
class ToolCatalog:
    """How the request's tools map to the policy's function tools and back.

    A freeform tool is a function taking one string, ``input``; a tool of a namespace group is
    the function ``<namespace>.<name>``. ``wire_name`` and ``custom`` undo both for the answer.
    """

    specs: tuple[ToolSpec, ...] = ()
    custom: frozenset[str] = frozenset()
    namespaced: tuple[tuple[str, str, str], ...] = ()  # (policy name, namespace, name)

    def policy_name(self, name: str, namespace: str | None) -> str:
        return f"{namespace}.{name}" if namespace else name

    def wire_name(self, policy_name: str) -> tuple[str, str | None]:
        """(name, namespace) of a call the policy made by ``policy_name``."""
        for qualified, namespace, name in self.namespaced:
            if qualified == policy_name:
                return name, namespace
        return policy_name, None

    def is_custom(self, policy_name: str) -> bool:
        return policy_name in self.custom


def _schema(raw: Any, at: str) -> str:
    if raw is None:
        return "{}"
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{at}.parameters: must be a JSON object", param=at)
    return msgspec.json.encode(raw).decode()


def _function(tool: dict[str, Any], at: str, namespace: str | None = None) -> ToolSpec:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{at}.name: a function tool needs a name", param=at)
    description = tool.get("description") or ""
    if not isinstance(description, str):
        raise InvalidRequest(f"{at}.description: must be a string", param=at)
    qualified = f"{namespace}.{name}" if namespace else name
    return ToolSpec(qualified, description, _schema(tool.get("parameters"), at))


def _custom(tool: dict[str, Any], at: str) -> ToolSpec:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{at}.name: a custom tool needs a name", param=at)
    description = str(tool.get("description") or "")
    fmt = tool.get("format")
    hint = "The raw input of the tool, free text."
    if isinstance(fmt, dict) and isinstance(fmt.get("definition"), str):
        hint += f" It follows this {fmt.get('syntax', 'grammar')} grammar:\n{fmt['definition']}"
    schema = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": hint}},
        "required": [CUSTOM_INPUT],
    }
    return ToolSpec(name, description, msgspec.json.encode(schema).decode())


def tool_catalog(tools: list[dict[str, Any]] | None) -> ToolCatalog:
    """The policy's tools for the request's ``tools``; hosted tools are left out."""
    specs: list[ToolSpec] = []
    custom: set[str] = set()
    namespaced: list[tuple[str, str, str]] = []
    for k, tool in enumerate(tools or ()):
        at = f"tools[{k}]"
        kind = tool.get("type")
        if kind == "function":
            specs.append(_function(tool, at))
        elif kind == "custom":
            spec = _custom(tool, at)
            specs.append(spec)
            custom.add(spec.name)
        elif kind == "namespace":
            namespace = tool.get("name")
            inner = tool.get("tools")
            if not isinstance(namespace, str) or not namespace or not isinstance(inner, list):
                raise InvalidRequest(f"{at}: a namespace needs a name and a list of tools", param=at)
            for j, t in enumerate(inner):
                if not isinstance(t, dict) or t.get("type", "function") != "function":
                    raise InvalidRequest(f"{at}.tools[{j}]: only function tools may be in a namespace")
                spec = _function(t, f"{at}.tools[{j}]", namespace)
                specs.append(spec)
                namespaced.append((spec.name, namespace, str(t["name"])))
        elif not isinstance(kind, str):
            raise InvalidRequest(f"{at}.type: required", param=at)
        # web_search, file_search, image_generation, ...: run by the API, not by the policy.
    return ToolCatalog(tuple(specs), frozenset(custom), tuple(namespaced))


# -- items to messages ----------------------------------------------------------------------------


def _text_of(content: Any, at: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{at}.content: must be a string or a list of content parts", param=at)
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in UNSUPPORTED_PARTS:
            raise InvalidRequest(
                f"{at}.content[{j}]: {kind} is not supported: this model reads text only", param=at
            )
        else:
            raise InvalidRequest(f"{at}.content[{j}]: unknown content part {kind!r}", param=at)
    return "".join(texts)


def _string(item: dict[str, Any], key: str, at: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"{at}.{key}: required, a string", param=at)
    return value


class _History:
    """Items folded into messages: runs of output items and of tool outputs are merged."""

    def __init__(self, catalog: ToolCatalog) -> None:
        self.catalog = catalog
        self.system: list[str] = []
        self.messages: list[Message] = []
        self._assistant: list[Block] = []
        self._results: list[Block] = []
        self.calls: set[str] = set()

    def _flush(self, keep: str) -> None:
        if keep != "assistant" and self._assistant:
            self.messages.append(Message(Role.ASSISTANT, tuple(self._assistant)))
            self._assistant = []
        if keep != "results" and self._results:
            self.messages.append(Message(Role.USER, tuple(self._results)))
            self._results = []

    def add(self, item: dict[str, Any], at: str) -> None:
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(item, at)
        elif kind == "reasoning":
            self._flush("assistant")
            thinking = decode_reasoning(item.get("encrypted_content"), at)
            if thinking is None:
                thinking = _text_of(item.get("content") or item.get("summary"), at)
            self._assistant.append(ThinkingBlock(thinking))
        elif kind in ("function_call", "custom_tool_call"):
            self._flush("assistant")
            call_id = _string(item, "call_id", at)
            namespace = item.get("namespace") if isinstance(item.get("namespace"), str) else None
            name = self.catalog.policy_name(_string(item, "name", at), namespace)
            if kind == "function_call":
                arguments = _string(item, "arguments", at) or "{}"
            else:
                arguments = msgspec.json.encode({CUSTOM_INPUT: _string(item, "input", at)}).decode()
            self.calls.add(call_id)
            self._assistant.append(ToolUseBlock(call_id, name, arguments))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self._flush("results")
            call_id = _string(item, "call_id", at)
            if call_id not in self.calls:
                raise InvalidRequest(
                    f"{at}: no function_call or custom_tool_call with call_id {call_id!r} precedes this output",
                    param=at,
                )
            output = item.get("output")
            content = output if isinstance(output, str) else _text_of(output, at)
            self._results.append(ToolResultBlock(call_id, content))
        elif kind is None:
            raise InvalidRequest(f"{at}.type: required for items that are not messages", param=at)
        else:
            raise InvalidRequest(
                f"{at}: item type {kind!r} is not supported; supported: {', '.join(ITEM_TYPES)}", param=at
            )

    def _message(self, item: dict[str, Any], at: str) -> None:
        role = item.get("role")
        text = _text_of(item.get("content"), at)
        if role in ("developer", "system"):
            self._flush("")
            if not self.messages:
                self.system.append(text)  # before the conversation: part of the system prompt
            else:
                self.messages.append(Message(Role.SYSTEM, (TextBlock(text),)))
        elif role == "user":
            self._flush("")
            self.messages.append(Message(Role.USER, (TextBlock(text),)))
        elif role == "assistant":
            self._flush("assistant")
            self._assistant.append(TextBlock(text))
        else:
            raise InvalidRequest(
                f"{at}.role: {role!r} is not one of user, assistant, developer, system", param=at
            )

    def done(self) -> tuple[str, tuple[Message, ...]]:
        self._flush("")
        return SYSTEM_SEPARATOR.join(self.system), tuple(self.messages)


def _thinking(body: ResponsesBody) -> bool:
    if body.chat_template_kwargs is not None and body.chat_template_kwargs.enable_thinking is not None:
        return body.chat_template_kwargs.enable_thinking
    return body.reasoning is not None and body.reasoning.effort in THINKING_EFFORTS


def _client_metadata(body: ResponsesBody) -> tuple[tuple[str, str], ...]:
    meta = body.client_metadata or {}
    return tuple(
        (str(k), v if isinstance(v, str) else msgspec.json.encode(v).decode()) for k, v in meta.items()
    )


def to_chat_request(body: ResponsesBody) -> tuple[ChatRequest, ToolCatalog]:
    """Translate a decoded request; ``InvalidRequest`` on what the API would refuse."""
    if body.previous_response_id is not None:
        raise InvalidRequest(
            "previous_response_id: this server stores no responses; send the whole history in input "
            "(with store: false)",
            param="previous_response_id",
        )
    catalog = tool_catalog(body.tools)
    history = _History(catalog)
    if body.instructions:
        history.system.append(body.instructions)
    if isinstance(body.input, str):
        history.add({"type": "message", "role": "user", "content": body.input}, "input")
    else:
        for i, item in enumerate(body.input):
            history.add(item, f"input[{i}]")
    system, messages = history.done()
    if not any(m.role != Role.SYSTEM for m in messages):
        raise InvalidRequest("input: at least one user or assistant item is required", param="input")
    chat = ChatRequest(
        system=system,
        messages=messages,
        tools=catalog.specs,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        thinking=_thinking(body),
        model=body.model,
        client_metadata=_client_metadata(body),
    )
    if body.max_output_tokens is not None:
        chat = msgspec.structs.replace(chat, max_tokens=body.max_output_tokens)
    return chat, catalog


def head_of(body: ResponsesBody, catalog: ToolCatalog, response_id: str) -> ResponseHead:
    return ResponseHead(
        response_id=response_id,
        created_at=int(time.time()),
        model=body.model,
        catalog_custom=catalog.custom,
        wire_name=catalog.wire_name,
        encrypted_reasoning=ENCRYPTED_REASONING in (body.include or ()),
        echo={
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": {
                "effort": body.reasoning.effort if body.reasoning else None,
                "summary": body.reasoning.summary if body.reasoning else None,
            },
            "store": False if body.store is None else body.store,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [],
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "metadata": body.metadata or {},
            "prompt_cache_key": body.prompt_cache_key,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
        },
    )


# -- the routes ---------------------------------------------------------------------------------


def routes(answerer: Answerer, keys: KeyResolver, settings: ApiSettings) -> list[Route]:
    """``/v1/responses`` over ``answerer``."""

    async def responses(request: Request) -> Response:
        try:
            execution = await authenticate(request, keys)
            body = await read_json(request, RESPONSES_DECODER, settings)
            chat, catalog = to_chat_request(body)
            request.state.chat_request = chat
            head = head_of(body, catalog, new_response_id())
            if not body.stream:
                answer = await answerer.complete(execution, chat)
                return Response(msgspec.json.encode(response_object(head, answer)), media_type=JSON)
            pump, first = await open_stream(answerer.stream(execution, chat), settings.stream_start_timeout_s)
        except Exception as exc:
            return openai_error_response(exc)
        encoder = ResponseEncoder(head)
        framing = StreamFraming[StreamEvent](
            opening=lambda first: encoder.start(),
            encode=encoder.encode,
            ping=b": ping\n\n",
            error=lambda err: b"".join(encoder.fail(err)),
            finished=lambda: encoder.done,
        )
        return SSEResponse(pump, first, framing, settings.ping_interval_s, headers=SSE_HEADERS)

    return [Route("/v1/responses", responses, methods=["POST"])]
