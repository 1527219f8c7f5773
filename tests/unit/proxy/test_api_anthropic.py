"""The Anthropic Messages adapter in process: parsing, validation, answers, streams, errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gyre_proxy.api import build_app
from gyre_proxy.api.adapter import decode_body
from gyre_proxy.api.anthropic import IMAGE_PLACEHOLDER, MESSAGES_DECODER, to_chat_request
from gyre_proxy.api.anthropic_answer import StreamEncoder, thinking_signature
from gyre_proxy.chat import (
    BlockKind,
    BlockStart,
    BlockStop,
    ChatRequest,
    ChatResponse,
    MessageDone,
    Role,
    StopReason,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolResultBlock,
    ToolUseBlock,
)
from gyre_proxy.chat.testing import KEY, FakeAnswerer, Reply, Scripted, StaticKeys, text_reply
from gyre_proxy.exceptions import ContextTooLong, EngineNotAccepting, InvalidRequest, Overloaded, RateLimited

pytestmark = pytest.mark.anyio

HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hello"}],
    }
    return {**base, **overrides}


def parse(raw: dict[str, Any] | bytes, *, require_max_tokens: bool = True) -> ChatRequest:
    data = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    return to_chat_request(decode_body(data, MESSAGES_DECODER), require_max_tokens=require_max_tokens)


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


async def post(
    answerer: FakeAnswerer,
    payload: Any,
    *,
    path: str = "/v1/messages",
    headers: dict[str, str] | None = None,
    **settings: Any,
) -> httpx.Response:
    app = build_app(answerer, StaticKeys(), model_name="qwen3-test", **settings)
    headers = HEADERS if headers is None else headers
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as http:
        content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return await http.post(path, content=content, headers=headers)


# -- parsing ------------------------------------------------------------------------------------


def test_system_string_blocks_and_system_messages_give_one_system_text() -> None:
    as_string = parse(body(system="You are a coder.\n\nBe brief."))
    as_blocks = parse(
        body(
            system=[
                {"type": "text", "text": "You are a coder.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Be brief."},
            ]
        )
    )
    folded = parse(
        body(
            system="You are a coder.",
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
        )
    )
    assert as_string.system == as_blocks.system == folded.system == "You are a coder.\n\nBe brief."
    assert [m.role for m in folded.messages] == [Role.USER]


def test_blocks_tools_and_sampling_options_are_translated() -> None:
    raw = json.dumps(
        body(
            max_tokens=321,
            temperature=0.5,
            top_p=0.9,
            stop_sequences=["END"],
            thinking={"type": "enabled", "budget_tokens": 1024},
            tools=[
                {"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}
            ],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "list files"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "use ls", "signature": "sig"},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "Bash",
                            "input": {"command": "ls", "n": 1},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [
                                {"type": "text", "text": "a.txt"},
                                {"type": "text", "text": "\nb.txt"},
                            ],
                            "is_error": False,
                        },
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        },
                    ],
                },
            ],
        )
    )
    # The tool input is an object: it is written as Qwen3's template writes an arguments object
    # (json.dumps), whatever spacing the client sent it with.
    request = parse(raw.replace('{"command": "ls", "n": 1}', '{"command":  "ls",   "n": 1}').encode())
    assert (request.max_tokens, request.temperature, request.top_p) == (321, 0.5, 0.9)
    assert request.stop == ("END",) and request.thinking and request.model == "claude-test"
    assert request.tools[0].input_schema_json == '{"type":"object","properties":{}}'
    assistant, result = request.messages[1], request.messages[2]
    assert assistant.blocks == (
        ThinkingBlock("use ls", "sig"),
        ToolUseBlock("toolu_1", "Bash", '{"command": "ls", "n": 1}'),
    )
    assert result.blocks == (ToolResultBlock("toolu_1", "a.txt\nb.txt"), TextBlock(IMAGE_PLACEHOLDER))


def test_fields_the_policy_cannot_honour_are_accepted() -> None:
    request = parse(
        body(
            output_config={"effort": "high"},
            context_management={"edits": []},
            metadata={"user_id": "u"},
            betas=["x"],
            tool_choice={"type": "auto"},
            thinking={"type": "disabled"},
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
                }
            ],
        )
    )
    assert request.messages[0].blocks == (TextBlock("hi"),) and not request.thinking


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "Expected `object`"),
        (body(max_tokens="ten"), "max_tokens"),
        (body(max_tokens=0), "max_tokens"),
        ({k: v for k, v in body().items() if k != "max_tokens"}, "max_tokens: Field required"),
        (body(messages=[]), "at least one message"),
        (body(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
        (body(messages=[{"role": "user", "content": [{"type": "video"}]}]), "type"),
        (body(messages=[{"role": "user", "content": []}]), "non-empty content"),
        (body(temperature=1.5), "temperature"),
        (body(messages=[{"role": "system", "content": "only system"}]), "user or assistant"),
        (
            body(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}],
                    }
                ]
            ),
            "tool_use_id",
        ),
        (
            body(
                messages=[
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "n", "input": [1]}],
                    }
                ]
            ),
            "JSON object",
        ),
        (
            body(
                messages=[
                    {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}
                ]
            ),
            "cannot hold",
        ),
    ],
)
def test_invalid_requests_are_refused_with_a_useful_message(
    raw: dict[str, Any] | bytes, fragment: str
) -> None:
    with pytest.raises(InvalidRequest, match=None) as caught:
        parse(raw)
    assert fragment in str(caught.value)


def test_count_tokens_needs_no_max_tokens() -> None:
    request = parse({k: v for k, v in body().items() if k != "max_tokens"}, require_max_tokens=False)
    assert request.messages[0].text() == "hello"


# -- over HTTP ----------------------------------------------------------------------------------


async def test_non_streaming_answer_is_a_message_object() -> None:
    thought = ThinkingBlock("hmm")
    reply = ChatResponse(
        blocks=(thought, TextBlock("hi"), ToolUseBlock("toolu_a", "Bash", '{"command": "ls"}')),
        stop_reason=StopReason.TOOL_USE,
        input_tokens=5,
        output_tokens=3,
    )
    answerer = FakeAnswerer([reply])
    response = await post(answerer, body(metadata={"user_id": "x"}))
    answer = response.json()
    assert response.status_code == 200
    assert answer["type"] == "message" and answer["role"] == "assistant" and answer["id"].startswith("msg_")
    assert answer["model"] == "claude-test" and answer["stop_reason"] == "tool_use"
    assert answer["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": thinking_signature("hmm")},
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {"command": "ls"}},
    ]
    assert answer["usage"]["input_tokens"] == 5 and answer["usage"]["output_tokens"] == 3
    assert answerer.requests[0].messages[0].text() == "hello"


async def test_streaming_answer_is_the_full_event_sequence() -> None:
    reply = ChatResponse(
        blocks=(
            ThinkingBlock("think hard"),
            TextBlock("hello there"),
            ToolUseBlock("toolu_b", "Read", '{"path": "a"}'),
        ),
        stop_reason=StopReason.TOOL_USE,
        input_tokens=12,
        output_tokens=8,
    )
    response = await post(FakeAnswerer([reply]), body(stream=True), path="/v1/messages?beta=true")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["usage"]["input_tokens"] == 12 and start["content"] == [] and start["stop_reason"] is None
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            key = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}.get(
                delta["type"]
            )
            if key is not None:
                block[key] = block.get(key, "") + delta[key] if key != "signature" else delta[key]
            else:
                block["json"] = block.get("json", "") + delta["partial_json"]
    assert blocks[0] == {
        "type": "thinking",
        "thinking": "think hard",
        "signature": thinking_signature("think hard"),
    }
    assert blocks[1] == {"type": "text", "text": "hello there"}
    assert blocks[2]["id"] == "toolu_b" and json.loads(blocks[2]["json"]) == {"path": "a"}
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == 8
    signature_at = names.index("content_block_delta", names.index("content_block_delta") + 4)
    assert events[signature_at][1]["delta"]["type"] == "signature_delta"
    assert names[signature_at + 1] == "content_block_stop"


async def test_error_after_the_stream_started_is_an_error_event() -> None:
    script = Scripted([BlockStart(0, BlockKind.TEXT), TextDelta(0, "par"), RuntimeError("secret detail")])
    response = await post(FakeAnswerer([script]), body(stream=True))
    events = sse_events(response.text)
    assert response.status_code == 200
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}},
    )


async def test_stream_that_ends_without_finishing_reports_an_error() -> None:
    response = await post(
        FakeAnswerer([Scripted([BlockStart(0, BlockKind.TEXT), TextDelta(0, "x")])]), body(stream=True)
    )
    assert sse_events(response.text)[-1][0] == "error"


@pytest.mark.parametrize(
    ("reply", "status", "kind"),
    [
        (RateLimited(retry_after_s=3), 429, "rate_limit_error"),
        (Overloaded(), 529, "overloaded_error"),
        (EngineNotAccepting(), 529, "overloaded_error"),
        (ContextTooLong(input_tokens=9000, limit=8192), 400, "invalid_request_error"),
        (RuntimeError("database password is hunter2"), 500, "api_error"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_answerer_errors_map_to_anthropic_statuses(
    reply: Reply, status: int, kind: str, stream: bool
) -> None:
    response = await post(FakeAnswerer([reply]), body(stream=stream))
    assert response.status_code == status
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert "hunter2" not in response.text
    if status == 400:
        assert error["error"]["message"] == "prompt is too long: 9000 tokens > 8192 maximum"
    if status == 429:
        assert response.headers["retry-after"] == "3"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"x-api-key": "sk-unknown"}, 401),
        ({"authorization": f"Bearer {KEY}"}, 200),
        ({"x-api-key": KEY}, 200),
    ],
)
async def test_api_key_from_either_header(headers: dict[str, str], status: int) -> None:
    answerer = FakeAnswerer([text_reply("ok")])
    response = await post(answerer, body(), headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response.json()["error"]["type"] == "authentication_error" and not answerer.requests


async def test_oversize_body_is_413() -> None:
    response = await post(FakeAnswerer([text_reply("ok")]), body(system="x" * 2000), max_body_bytes=1000)
    assert response.status_code == 413 and response.json()["error"]["type"] == "request_too_large"


async def test_bad_request_over_http_has_anthropic_shape() -> None:
    response = await post(FakeAnswerer([text_reply("ok")]), b"{")
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_count_tokens_endpoint() -> None:
    answerer = FakeAnswerer([text_reply("unused")], token_count=77)
    payload = {k: v for k, v in body().items() if k != "max_tokens"}
    response = await post(answerer, payload, path="/v1/messages/count_tokens")
    assert response.json() == {"input_tokens": 77}


async def test_unknown_path_answers_in_anthropic_shape() -> None:
    response = await post(FakeAnswerer([text_reply("ok")]), body(), path="/v1/messages/nope")
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"


# -- the stream encoder on its own --------------------------------------------------------------


def test_encoder_renumbers_blocks_and_closes_open_ones() -> None:
    encoder = StreamEncoder(message_id="msg_1", model="m")
    frames = [
        *encoder.encode(BlockStart(7, BlockKind.THINKING)),
        *encoder.encode(ThinkingDelta(7, "a")),
        *encoder.encode(TextDelta(99, "stray")),  # no such block: dropped
        *encoder.encode(MessageDone(StopReason.END_TURN, 1, 2)),
        *encoder.encode(BlockStop(7)),  # after the end: dropped
    ]
    events = sse_events(b"".join(frames).decode())
    assert [name for name, _ in events] == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert {data.get("index") for _, data in events[:4]} == {0}
    assert events[2][1]["delta"] == {"type": "signature_delta", "signature": thinking_signature("a")}
