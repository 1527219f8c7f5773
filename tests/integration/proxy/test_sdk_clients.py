"""The proxy's HTTP API driven by the official ``anthropic`` and ``openai`` SDKs over loopback.

A scripted answerer sits behind a real uvicorn server; the tests check what the SDKs parse out
of our answers, what the answerer received, which SDK exception each error becomes, and that a
client hanging up mid-stream closes the answerer's stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anthropic
import httpx
import openai
import pytest

from gyre_proxy import ContextTooLong, Overloaded, RateLimited
from gyre_proxy.api import build_app, proxy_server
from gyre_proxy.chat import (
    BlockKind,
    BlockStart,
    ChatResponse,
    StopReason,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gyre_proxy.chat.testing import KEY, FakeAnswerer, Reply, Scripted, StaticKeys, text_reply, tool_reply

MODEL = "qwen3-served"
TOOLS = [
    {"name": "Bash", "description": "run a command", "input_schema": {"type": "object", "properties": {}}}
]


@contextmanager
def serving(answerer: FakeAnswerer, **settings: float) -> Iterator[str]:
    app = build_app(answerer, StaticKeys(), model_name=MODEL, **settings)  # type: ignore[arg-type]
    with proxy_server(app) as server:
        yield server.base_url


@contextmanager
def claude(answerer: FakeAnswerer, *, api_key: str = KEY) -> Iterator[anthropic.Anthropic]:
    with (
        serving(answerer) as url,
        anthropic.Anthropic(base_url=url, api_key=api_key, max_retries=0) as client,
    ):
        yield client


@contextmanager
def gpt(answerer: FakeAnswerer, *, api_key: str = KEY) -> Iterator[openai.OpenAI]:
    with (
        serving(answerer) as url,
        openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0) as client,
    ):
        yield client


# -- Anthropic ----------------------------------------------------------------------------------


def test_anthropic_tool_use_round_trip() -> None:
    answerer = FakeAnswerer(
        [tool_reply("toolu_abc", "Bash", '{"command": "ls"}', preface="Looking."), text_reply("2 files")]
    )
    with claude(answerer) as client:
        first = client.messages.create(
            model="claude-x",
            max_tokens=50,
            tools=TOOLS,
            messages=[{"role": "user", "content": "list"}],  # type: ignore[list-item]
        )
        assert first.stop_reason == "tool_use"
        assert [b.type for b in first.content] == ["text", "tool_use"]
        call = first.content[1]
        assert call.type == "tool_use" and call.input == {"command": "ls"} and call.id == "toolu_abc"
        second = client.messages.create(
            model="claude-x",
            max_tokens=50,
            messages=[
                {"role": "user", "content": "list"},
                {"role": "assistant", "content": first.content},  # type: ignore[typeddict-item]
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a b"}],
                },
            ],
        )
    assert second.content[0].type == "text" and second.content[0].text == "2 files"
    assert second.usage.input_tokens == 11 and second.usage.output_tokens == 7
    replayed = answerer.requests[1].messages
    # the SDK sends the input compact; it is written as Qwen3's template writes an arguments object
    assert replayed[1].blocks[1] == ToolUseBlock("toolu_abc", "Bash", '{"command": "ls"}')
    assert replayed[2].blocks == (ToolResultBlock("toolu_abc", "a b"),)
    assert answerer.requests[0].tools[0].input_schema_json == '{"type":"object","properties":{}}'


def test_anthropic_beta_stream_accumulates_thinking_text_and_tool_input() -> None:
    reply = ChatResponse(
        blocks=(
            ThinkingBlock("plan it"),
            TextBlock("Running now."),
            ToolUseBlock("toolu_s", "Bash", '{"command": "pwd"}'),
        ),
        stop_reason=StopReason.TOOL_USE,
        input_tokens=30,
        output_tokens=12,
    )
    answerer = FakeAnswerer([reply])
    with (
        claude(answerer) as client,
        client.beta.messages.stream(
            model="claude-x",
            max_tokens=64,
            system=[{"type": "text", "text": "be terse", "cache_control": {"type": "ephemeral"}}],
            thinking={"type": "enabled", "budget_tokens": 32},
            messages=[{"role": "user", "content": "where am I?"}],
            betas=["interleaved-thinking-2025-05-14"],
        ) as stream,
    ):
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text == "Running now."
    thinking, said, call = message.content
    assert (
        thinking.type == "thinking"
        and thinking.thinking == "plan it"
        and thinking.signature.startswith("gyre1.")
    )
    assert said.type == "text" and said.text == "Running now."
    assert call.type == "tool_use" and call.input == {"command": "pwd"}
    assert (
        message.stop_reason == "tool_use"
        and message.usage.input_tokens == 30
        and message.usage.output_tokens == 12
    )
    assert answerer.requests[0].thinking and answerer.requests[0].system == "be terse"
    assert answerer.stream_endings == ["completed"]


def test_anthropic_count_tokens() -> None:
    with claude(FakeAnswerer([text_reply("x")], token_count=123)) as client:
        counted = client.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens == 123


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (RateLimited(), anthropic.RateLimitError),
        (Overloaded(), anthropic.InternalServerError),
        (RuntimeError("boom"), anthropic.InternalServerError),
        (ContextTooLong(input_tokens=9, limit=8), anthropic.BadRequestError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_errors_raise_the_sdk_classes(reply: Reply, error: type[Exception], stream: bool) -> None:
    with claude(FakeAnswerer([reply])) as client, pytest.raises(error) as caught:
        client.messages.create(
            model="claude-x", max_tokens=5, stream=stream, messages=[{"role": "user", "content": "hi"}]
        )
    if isinstance(reply, ContextTooLong):
        assert "prompt is too long" in str(caught.value)


def test_anthropic_invalid_request_and_bad_key() -> None:
    with (
        claude(FakeAnswerer([text_reply("x")])) as client,
        pytest.raises(anthropic.BadRequestError, match="tool_use_id"),
    ):
        client.messages.create(
            model="claude-x",
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_none", "content": "x"}],
                }
            ],
        )
    with (
        claude(FakeAnswerer([text_reply("x")]), api_key="sk-wrong") as client,
        pytest.raises(anthropic.AuthenticationError),
    ):
        client.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}])


# -- OpenAI -------------------------------------------------------------------------------------


def test_openai_tool_calls_round_trip() -> None:
    answerer = FakeAnswerer([tool_reply("toolu_o", "Bash", '{"command": "ls"}'), text_reply("done")])
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]
    with gpt(answerer) as client:
        first = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}], tools=tools
        )  # type: ignore[list-item]
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls is not None
        call = message.tool_calls[0]
        assert call.id == "toolu_o" and call.function.name == "Bash"  # type: ignore[union-attr]
        second = client.chat.completions.create(
            model="m",
            messages=[
                {"role": "user", "content": "go"},
                message.model_dump(exclude_none=True),  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": call.id, "content": "a b"},
            ],
        )
    assert second.choices[0].message.content == "done" and second.usage is not None
    assert answerer.requests[1].messages[2].blocks == (ToolResultBlock("toolu_o", "a b"),)


def test_openai_stream_with_usage_and_models_list() -> None:
    answerer = FakeAnswerer([text_reply("streamed words", input_tokens=3, output_tokens=2)])
    with gpt(answerer) as client:
        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        models = [m.id for m in client.models.list()]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "streamed words"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 5
    assert models == [MODEL]


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (RateLimited(), openai.RateLimitError),
        (Overloaded(), openai.InternalServerError),
        (ContextTooLong(input_tokens=9, limit=8), openai.BadRequestError),
    ],
)
def test_openai_errors_raise_the_sdk_classes(reply: Reply, error: type[Exception]) -> None:
    with gpt(FakeAnswerer([reply])) as client, pytest.raises(error):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def test_openai_invalid_request_and_bad_key() -> None:
    with gpt(FakeAnswerer([text_reply("x")])) as client, pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m", messages=[{"role": "tool", "tool_call_id": "nope", "content": "x"}]
        )
    with (
        gpt(FakeAnswerer([text_reply("x")]), api_key="sk-wrong") as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


# -- hanging up ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
def test_client_disconnect_closes_the_answerer_stream(path: str) -> None:
    hang = Scripted([BlockStart(0, BlockKind.TEXT), TextDelta(0, "partial"), 600.0, TextDelta(0, "never")])
    answerer = FakeAnswerer([hang])
    payload = {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with serving(answerer, ping_interval_s=0.05) as url, httpx.Client(base_url=url) as http:
        with http.stream("POST", path, json=payload, headers={"x-api-key": KEY}) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            for line in lines:
                if "partial" in line:
                    break
            later = [next(lines) for _ in range(6)]  # pings keep coming while the answerer waits
            assert any("ping" in line for line in later)
        assert answerer.closed.wait(5.0), "the answerer's stream was not closed after the client hung up"
    assert answerer.stream_endings == ["closed"]
    assert answerer.requests[0].messages[0].text() == "hi"
