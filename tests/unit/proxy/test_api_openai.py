"""The OpenAI Chat Completions adapter in process: parsing, answers, chunks, errors, models."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gyre_proxy import ContextTooLong, InvalidRequest, Overloaded, RateLimited
from gyre_proxy.api import build_app
from gyre_proxy.api.adapter import decode_body
from gyre_proxy.api.openai_chat import COMPLETIONS_DECODER, to_chat_request
from gyre_proxy.chat import (
    ChatResponse,
    Role,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gyre_proxy.chat.testing import KEY, FakeAnswerer, Reply, StaticKeys, text_reply

pytestmark = pytest.mark.anyio

HEADERS = {"authorization": f"Bearer {KEY}"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command":  "ls"}'}}


def body(**overrides: Any) -> dict[str, Any]:
    return {"model": "qwen3-test", "messages": [{"role": "user", "content": "hi"}], **overrides}


async def request(
    answerer: FakeAnswerer,
    payload: Any,
    *,
    method: str = "POST",
    path: str = "/v1/chat/completions",
    headers: Any = None,
) -> httpx.Response:
    app = build_app(answerer, StaticKeys(), model_name="qwen3-served")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as http:
        content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return await http.request(
            method, path, content=content, headers=HEADERS if headers is None else headers
        )


def chunks(text: str) -> list[Any]:
    frames = [f.removeprefix("data: ") for f in text.strip().split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def test_roles_tool_messages_and_options_are_translated() -> None:
    chat = to_chat_request(
        decode_body(
            json.dumps(
                body(
                    max_completion_tokens=64,
                    temperature=1.5,
                    stop="END",
                    chat_template_kwargs={"enable_thinking": True},
                    tools=[
                        {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}
                    ],
                    response_format={"type": "text"},
                    seed=3,
                    messages=[
                        {"role": "system", "content": "sys"},
                        {"role": "developer", "content": [{"type": "text", "text": "dev"}]},
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": "go"},
                                {"type": "image_url", "image_url": {"url": "x"}},
                            ],
                        },
                        {
                            "role": "assistant",
                            "content": None,
                            "reasoning_content": "r",
                            "tool_calls": [CALL, {**CALL, "id": "call_2"}],
                        },
                        {"role": "tool", "tool_call_id": "call_1", "content": "out1"},
                        {
                            "role": "tool",
                            "tool_call_id": "call_2",
                            "content": [{"type": "text", "text": "out2"}],
                        },
                        {"role": "user", "content": "next"},
                    ],
                )
            ).encode(),
            COMPLETIONS_DECODER,
        )
    )
    assert chat.system == "sys\n\ndev" and chat.max_tokens == 64 and chat.temperature == 1.5
    assert chat.stop == ("END",) and chat.thinking and chat.tools[0].input_schema_json == '{"type":"object"}'
    assert [m.role for m in chat.messages] == [Role.USER, Role.ASSISTANT, Role.USER, Role.USER]
    assert chat.messages[1].blocks == (
        ThinkingBlock("r"),
        ToolUseBlock("call_1", "Bash", '{"command":  "ls"}'),
        ToolUseBlock("call_2", "Bash", '{"command":  "ls"}'),
    )
    assert chat.messages[2].blocks == (ToolResultBlock("call_1", "out1"), ToolResultBlock("call_2", "out2"))


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (body(messages=[]), "at least one message"),
        (body(n=2), "n=1"),
        (body(messages=[{"role": "tool", "tool_call_id": "nope", "content": "x"}]), "tool_calls"),
        (body(messages=[{"role": "tool", "content": "x"}]), "tool_call_id"),
        (body(messages=[{"role": "robot", "content": "x"}]), "role"),
        (body(temperature=3), "temperature"),
        (body(max_tokens=0), "max_tokens"),
    ],
)
def test_invalid_requests_are_refused(payload: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        to_chat_request(decode_body(json.dumps(payload).encode(), COMPLETIONS_DECODER))
    assert fragment in str(caught.value)


async def test_non_streaming_completion() -> None:
    reply = ChatResponse(
        blocks=(ThinkingBlock("t"), TextBlock("calling"), ToolUseBlock("toolu_x", "Bash", '{"a": 1}')),
        stop_reason=StopReason.TOOL_USE,
        input_tokens=4,
        output_tokens=6,
    )
    response = await request(FakeAnswerer([reply]), body())
    answer = response.json()
    assert answer["object"] == "chat.completion" and answer["model"] == "qwen3-test"
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "calling",
        "reasoning_content": "t",
        "tool_calls": [
            {"id": "toolu_x", "type": "function", "function": {"name": "Bash", "arguments": '{"a": 1}'}}
        ],
    }
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}


async def test_streaming_chunks_with_tool_calls_and_usage() -> None:
    reply = ChatResponse(
        blocks=(TextBlock("abcdef"), ToolUseBlock("toolu_y", "Read", '{"path": "/x"}')),
        stop_reason=StopReason.TOOL_USE,
        input_tokens=3,
        output_tokens=5,
    )
    response = await request(FakeAnswerer([reply]), body(stream=True, stream_options={"include_usage": True}))
    parsed = chunks(response.text)
    assert all(c["object"] == "chat.completion.chunk" for c in parsed)
    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in parsed if c["choices"])
    assert content == "abcdef"
    calls = [t for c in parsed if c["choices"] for t in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0] == {
        "index": 0,
        "id": "toolu_y",
        "type": "function",
        "function": {"name": "Read", "arguments": ""},
    }
    assert json.loads("".join(t["function"]["arguments"] for t in calls)) == {"path": "/x"}
    assert parsed[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["total_tokens"] == 8
    assert all("usage" in c for c in parsed)


async def test_streaming_without_usage_has_no_usage_chunk() -> None:
    response = await request(FakeAnswerer([text_reply("hello")]), body(stream=True))
    parsed = chunks(response.text)
    assert parsed[-1]["choices"][0]["finish_reason"] == "stop" and "usage" not in parsed[-1]


@pytest.mark.parametrize(
    ("reply", "status", "kind", "code"),
    [
        (RateLimited(), 429, "requests", "rate_limit_exceeded"),
        (Overloaded(), 503, "server_error", "overloaded"),
        (ContextTooLong(input_tokens=10, limit=5), 400, "invalid_request_error", "context_length_exceeded"),
        (KeyError("internal"), 500, "server_error", None),
    ],
)
async def test_answerer_errors_map_to_openai_statuses(
    reply: Reply, status: int, kind: str, code: str | None
) -> None:
    response = await request(FakeAnswerer([reply]), body(stream=True))
    error = response.json()["error"]
    assert response.status_code == status and (error["type"], error["code"]) == (kind, code)
    assert set(error) == {"message", "type", "param", "code"}


async def test_unknown_key_and_bad_json() -> None:
    unauthorized = await request(
        FakeAnswerer([text_reply("x")]), body(), headers={"authorization": "Bearer nope"}
    )
    assert unauthorized.status_code == 401 and unauthorized.json()["error"]["code"] == "invalid_api_key"
    bad = await request(FakeAnswerer([text_reply("x")]), b"{oops")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


async def test_models_lists_the_served_model_in_either_shape() -> None:
    openai_shape = await request(FakeAnswerer([text_reply("x")]), b"", method="GET", path="/v1/models")
    assert openai_shape.json()["data"][0]["id"] == "qwen3-served"
    anthropic_headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    anthropic_shape = await request(
        FakeAnswerer([text_reply("x")]), b"", method="GET", path="/v1/models", headers=anthropic_headers
    )
    assert anthropic_shape.json()["data"][0] == {
        "type": "model",
        "id": "qwen3-served",
        "display_name": "qwen3-served",
        "created_at": "1970-01-01T00:00:00Z",
    }
    health = await request(FakeAnswerer([text_reply("x")]), b"", method="GET", path="/health", headers={})
    assert health.json() == {"status": "ok"}
