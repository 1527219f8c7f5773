"""The proxy's OpenAI Responses API driven by the official ``openai`` SDK over loopback.

A scripted answerer sits behind a real uvicorn server: the tests check what the SDK's
Responses client parses out of our answers (``responses.create``, streaming and not, and
``responses.stream`` with its snapshot accumulation), what the answerer received from the
items Codex-style histories send back, and which SDK exception each error becomes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from gyre_proxy import ContextTooLong, Overloaded, RateLimited
from gyre_proxy.api import build_app, proxy_server
from gyre_proxy.chat import (
    BlockKind,
    BlockStart,
    ChatResponse,
    Role,
    StopReason,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gyre_proxy.chat.testing import KEY, FakeAnswerer, Reply, Scripted, StaticKeys, text_reply, tool_reply

MODEL = "qwen3-served"
TOOLS: list[Any] = [
    {"type": "function", "name": "exec_command", "description": "run", "strict": False,
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "custom", "name": "apply_patch", "description": "edit files",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "sub-agents",
     "tools": [{"type": "function", "name": "spawn_agent", "description": "spawn",
                "parameters": {"type": "object", "properties": {"message": {"type": "string"}}}}]},
    {"type": "web_search", "external_web_access": True},
]  # fmt: skip


@contextmanager
def serving(answerer: FakeAnswerer, **settings: Any) -> Iterator[str]:
    app = build_app(answerer, StaticKeys(), model_name=MODEL, **settings)
    with proxy_server(app) as server:
        yield server.base_url


@contextmanager
def client_for(answerer: FakeAnswerer, *, api_key: str = KEY, **settings: Any) -> Iterator[openai.OpenAI]:
    with (
        serving(answerer, **settings) as url,
        openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0) as client,
    ):
        yield client


def thought_reply(thinking: str, text: str) -> ChatResponse:
    return ChatResponse(
        blocks=(ThinkingBlock(thinking), TextBlock(text)),
        stop_reason=StopReason.END_TURN,
        input_tokens=12,
        output_tokens=8,
    )


def test_create_tool_call_round_trip_with_function_custom_and_namespaced_tools() -> None:
    answerer = FakeAnswerer(
        [
            tool_reply("toolu_1", "exec_command", '{"cmd":  "ls"}', preface="Looking."),
            tool_reply("toolu_2", "multi_agent_v1.spawn_agent", '{"message": "check"}'),
            tool_reply("toolu_3", "apply_patch", '{"input": "*** Begin Patch\\n*** End Patch"}'),
            text_reply("all done"),
        ]
    )
    with client_for(answerer) as client:
        history: list[Any] = [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Be brief."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list"}]},
        ]
        outputs = {"exec_command": "a b", "spawn_agent": '{"agent_id": "x"}', "apply_patch": "patched"}
        for _ in range(3):
            response = client.responses.create(model="m", input=history, tools=TOOLS, store=False)
            assert response.status == "completed" and response.usage is not None
            calls = [o for o in response.output if o.type in ("function_call", "custom_tool_call")]
            assert len(calls) == 1
            call = calls[0]
            history += [o.model_dump(exclude_none=True) for o in response.output]
            kind = "custom_tool_call_output" if call.type == "custom_tool_call" else "function_call_output"
            history.append({"type": kind, "call_id": call.call_id, "output": outputs[call.name]})
        final = client.responses.create(model="m", input=history, tools=TOOLS)
    assert final.output_text == "all done"
    first = answerer.requests[0]
    assert first.system == "Be brief." and [m.role for m in first.messages] == [Role.USER]
    assert [t.name for t in first.tools] == ["exec_command", "apply_patch", "multi_agent_v1.spawn_agent"]
    assert json.loads(first.tools[1].input_schema_json)["required"] == ["input"]
    last = answerer.requests[3].messages
    assert last[1].blocks == (
        TextBlock("Looking."),
        ToolUseBlock("toolu_1", "exec_command", '{"cmd":  "ls"}'),
    )
    assert last[2].blocks == (ToolResultBlock("toolu_1", "a b"),)
    assert last[3].blocks == (ToolUseBlock("toolu_2", "multi_agent_v1.spawn_agent", '{"message": "check"}'),)
    # a freeform call comes back as its raw input; the policy sees it as {"input": ...}
    (patch,) = last[5].blocks
    assert isinstance(patch, ToolUseBlock) and patch.name == "apply_patch"
    assert json.loads(patch.input_json) == {"input": "*** Begin Patch\n*** End Patch"}
    assert last[6].blocks == (ToolResultBlock("toolu_3", "patched"),)


def test_namespaced_and_custom_calls_are_answered_in_their_own_item_shapes() -> None:
    answerer = FakeAnswerer(
        [
            tool_reply("toolu_n", "multi_agent_v1.spawn_agent", '{"message": "go"}'),
            tool_reply("toolu_c", "apply_patch", '{"input": "raw text"}'),
        ]
    )
    with client_for(answerer) as client:
        spawn = client.responses.create(model="m", input="x", tools=TOOLS).output[0]
        patch = client.responses.create(model="m", input="x", tools=TOOLS).output[0]
    assert spawn.type == "function_call" and spawn.name == "spawn_agent"
    assert spawn.model_dump()["namespace"] == "multi_agent_v1"
    assert patch.type == "custom_tool_call" and patch.input == "raw text" and patch.call_id == "toolu_c"


def test_stream_helper_accumulates_reasoning_text_and_calls_in_order() -> None:
    answerer = FakeAnswerer(
        [
            ChatResponse(
                blocks=(
                    ThinkingBlock("I should look.\nFirst ls."),
                    TextBlock("Running it."),
                    ToolUseBlock("toolu_s", "exec_command", '{"cmd": "ls -la"}'),
                ),
                stop_reason=StopReason.TOOL_USE,
                input_tokens=30,
                output_tokens=12,
            )
        ]
    )
    with (
        client_for(answerer) as client,
        client.responses.stream(
            model="m",
            input="look around",
            tools=TOOLS,
            reasoning={"effort": "medium", "summary": "auto"},
            include=["reasoning.encrypted_content"],
        ) as stream,
    ):
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    for kind in (
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ):
        assert kind in kinds
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = final.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "I should look.\nFirst ls."
    assert reasoning.encrypted_content and message.type == "message"
    assert message.content[0].text == "Running it."  # type: ignore[union-attr]
    assert (
        call.type == "function_call" and call.arguments == '{"cmd": "ls -la"}' and call.call_id == "toolu_s"
    )
    assert final.usage is not None and final.usage.input_tokens == 30 and final.usage.total_tokens == 42
    assert answerer.requests[0].thinking


def test_encrypted_reasoning_restores_the_exact_thinking_and_its_absence_still_translates() -> None:
    thinking = "  exact \u00e9 text\n\nwith  spacing "
    answerer = FakeAnswerer([thought_reply(thinking, "hi"), text_reply("again")])
    with client_for(answerer) as client:
        first = client.responses.create(
            model="m", input="hello", include=["reasoning.encrypted_content"], reasoning={"effort": "low"}
        )
        items = [o.model_dump(exclude_none=True) for o in first.output]
        # the summary is what a client shows; the encrypted content is what restores the text
        items[0]["summary"] = [{"type": "summary_text", "text": "(summarized)"}]
        client.responses.create(
            model="m",
            input=[{"role": "user", "content": "hello"}, *items, {"role": "user", "content": "more"}],
        )
        without = {k: v for k, v in items[0].items() if k != "encrypted_content"}
        client.responses.create(
            model="m",
            input=[
                {"role": "user", "content": "hello"},
                without,
                items[1],
                {"role": "user", "content": "more"},
            ],
        )
    restored = answerer.requests[1].messages[1].blocks
    assert restored == (ThinkingBlock(thinking), TextBlock("hi"))
    summarized = answerer.requests[2].messages[1].blocks
    assert summarized == (ThinkingBlock("(summarized)"), TextBlock("hi"))


def test_raw_stream_events_carry_increasing_sequence_numbers() -> None:
    answerer = FakeAnswerer([text_reply("streamed words", input_tokens=3, output_tokens=2)])
    with client_for(answerer) as client:
        events = list(client.responses.create(model="m", input="hi", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "streamed words"
    done = events[-1]
    assert done.type == "response.completed" and done.response.output_text == "streamed words"


def test_max_tokens_ends_as_incomplete() -> None:
    cut = ChatResponse(
        blocks=(TextBlock("half"),), stop_reason=StopReason.MAX_TOKENS, input_tokens=3, output_tokens=4
    )
    answerer = FakeAnswerer([cut, cut])
    with client_for(answerer) as client:
        plain = client.responses.create(model="m", input="hi", max_output_tokens=4)
        events = list(client.responses.create(model="m", input="hi", max_output_tokens=4, stream=True))
    assert plain.status == "incomplete" and plain.incomplete_details is not None
    assert plain.incomplete_details.reason == "max_output_tokens"
    assert events[-1].type == "response.incomplete"
    assert answerer.requests[0].max_tokens == 4


def test_developer_messages_later_in_the_history_stay_system_turns() -> None:
    answerer = FakeAnswerer([text_reply("ok")])
    with client_for(answerer) as client:
        client.responses.create(
            model="m",
            instructions="Base.",
            input=[
                {"role": "developer", "content": "Rules."},
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "two"}]},
                {"role": "developer", "content": "Now in plan mode."},
                {"role": "user", "content": "three"},
            ],
            extra_body={"client_metadata": {"thread_id": "t-1", "x": {"nested": 1}}, "unknown_field": [1]},
        )
    request = answerer.requests[0]
    assert request.system == "Base.\n\nRules."
    assert [m.role for m in request.messages] == [Role.USER, Role.ASSISTANT, Role.SYSTEM, Role.USER]
    assert request.messages[2].text() == "Now in plan mode."
    assert dict(request.client_metadata) == {"thread_id": "t-1", "x": '{"nested":1}'}


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (RateLimited(), openai.RateLimitError),
        (Overloaded(), openai.InternalServerError),
        (ContextTooLong(input_tokens=9, limit=8), openai.BadRequestError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_answerer_errors_raise_the_sdk_classes(reply: Reply, error: type[Exception], stream: bool) -> None:
    with client_for(FakeAnswerer([reply])) as client, pytest.raises(error) as raised:
        if stream:
            list(client.responses.create(model="m", input="hi", stream=True))
        else:
            client.responses.create(model="m", input="hi")
    if isinstance(reply, ContextTooLong):
        assert (
            isinstance(raised.value, openai.BadRequestError)
            and raised.value.code == "context_length_exceeded"
        )


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"type": "local_shell_call", "call_id": "c"}], "item type 'local_shell_call' is not supported"),
        ([{"type": "function_call_output", "call_id": "nope", "output": "x"}], "no function_call or custom_tool_call with call_id 'nope'"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}], "input_image is not supported"),
        ([{"role": "critic", "content": "x"}], "'critic' is not one of"),
        ([{"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-from-elsewhere"}], "not written by this server"),
        ([{"role": "developer", "content": "only rules"}], "at least one user or assistant item"),
    ],
)  # fmt: skip
def test_bad_input_is_a_bad_request_with_a_clear_message(items: list[Any], message: str) -> None:
    answerer = FakeAnswerer([text_reply("x")])
    with client_for(answerer) as client, pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="m", input=items)
    assert message in str(raised.value)
    assert answerer.requests == []  # refused before the answerer saw anything


def test_previous_response_id_bad_key_and_oversized_body() -> None:
    answerer = FakeAnswerer([text_reply("x")])
    with client_for(answerer) as client, pytest.raises(openai.BadRequestError, match="stores no responses"):
        client.responses.create(model="m", input="hi", previous_response_id="resp_1")
    with client_for(answerer, api_key="sk-wrong") as client, pytest.raises(openai.AuthenticationError):
        client.responses.create(model="m", input="hi")
    with client_for(answerer, max_body_bytes=1000) as client, pytest.raises(openai.APIStatusError) as raised:
        client.responses.create(model="m", input="x" * 2000)
    assert raised.value.status_code == 413
    assert answerer.requests == []


def test_an_error_mid_stream_is_an_error_event_then_response_failed() -> None:
    broken = Scripted(
        [BlockStart(0, BlockKind.TEXT), TextDelta(0, "part"), 0.2, Overloaded("engine went away")]
    )
    with client_for(FakeAnswerer([broken]), stream_start_timeout_s=0.05) as client:
        events = list(client.responses.create(model="m", input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[-2:] == ["error", "response.failed"]
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.error is not None
    assert failed.response.error.code == "overloaded" and "engine went away" in failed.response.error.message


def test_codex_style_request_over_plain_http() -> None:
    """The body shape Codex 0.171 sends (captured), as JSON over HTTP: streamed named events."""
    answerer = FakeAnswerer([text_reply("OK.")])
    body = {
        "model": "gyre-policy",
        "stream": True,
        "input": [
            {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
            {"type": "message", "id": "msg_3", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
        ],
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "client_metadata": {"session_id": "s", "thread_id": "t"},
    }  # fmt: skip
    with serving(answerer) as url, httpx.Client(base_url=url) as http:
        response = http.post("/v1/responses", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in response.text.split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    payloads = [json.loads(f.split("\n")[1].removeprefix("data: ")) for f in frames]
    assert names == [p["type"] for p in payloads]
    done = [p["item"] for p in payloads if p["type"] == "response.output_item.done"]
    assert done == [{"id": done[0]["id"], "type": "message", "role": "assistant", "status": "completed",
                     "content": [{"type": "output_text", "text": "OK.", "annotations": [], "logprobs": []}]}]  # fmt: skip
    assert payloads[-1]["response"]["usage"]["input_tokens"] == 11
    request = answerer.requests[0]
    assert request.system == "You are Codex." and not request.thinking
    assert [t.name for t in request.tools][-1] == "multi_agent_v1.spawn_agent"  # web_search is left out
