"""The tool-call payload cache by call id, for all three APIs: a history whose tool calls the
client re-serialized or rewrote still matches the stored output; a call id from another
execution is refused; and the Claude Code request shapes that used to split an execution
(a role:system message as blocks, then as a string; a sub-agent prompt after a reminder block)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from gyre_proxy.chat import ChatRequest, Message, Role, TextBlock, ToolUseBlock
from gyre_proxy.exceptions import InvalidRequest
from gyre_proxy.harness import ClaudeCodeHarness, GenericHarness
from gyre_proxy.ingest import Ingestor, PayloadCache, Qwen3Template
from gyre_store import InMemoryEventLog
from gyre_store.catalog import AgentKind, CallFinish
from gyre_store.trees import ExecutionContext, TrajectoryRecorder
from tests.unit.proxy.three_apis import translate

# What the policy sampled: odd spacing and an escaped character, as a model may write it.
SAMPLED = '{"command":  "echo \\u00e9 > a.txt",   "timeout": 5}'
TOOL = {
    "name": "Bash",
    "description": "run",
    "schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


def bodies(api: str, arguments: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first request and the follow-up carrying the call back with ``arguments``."""
    if api == "anthropic":
        tools = [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["schema"]}]
        user = {"role": "user", "content": "go"}
        call = {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": arguments}],
        }
        result = {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}],
        }
        return {"tools": tools, "messages": [user]}, {"tools": tools, "messages": [user, call, result]}
    if api == "openai-chat":
        tools = [
            {
                "type": "function",
                "function": {"name": "Bash", "description": "run", "parameters": TOOL["schema"]},
            }
        ]
        user = {"role": "user", "content": "go"}
        fn = {"name": "Bash", "arguments": arguments}
        call = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": fn}],
        }
        result = {"role": "tool", "tool_call_id": "toolu_1", "content": "done"}
        return {"tools": tools, "messages": [user]}, {"tools": tools, "messages": [user, call, result]}
    tools = [{"type": "function", "name": "Bash", "description": "run", "parameters": TOOL["schema"]}]
    user = {"role": "user", "content": "go"}
    call = {"type": "function_call", "call_id": "toolu_1", "name": "Bash", "arguments": arguments}
    result = {"type": "function_call_output", "call_id": "toolu_1", "output": "done"}
    return {"tools": tools, "input": [user]}, {"tools": tools, "input": [user, call, result]}


def answer_first(ing: Ingestor, template: Qwen3Template, first: ChatRequest) -> int:
    """Record the policy's answer to ``first`` (the sampled call); returns the stored full length."""
    prepared = ing.prepare("ex", "run", first)
    answer = Message(Role.ASSISTANT, (ToolUseBlock("toolu_1", "Bash", SAMPLED),))
    out = template.render_output(answer)
    ing.record(
        prepared, request_id="r1", output_ids=np.array(out.ids, np.int32),
        output_logprobs=np.full(len(out), -0.5, np.float32), assistant=answer, finish=CallFinish.STOP,
    )  # fmt: skip
    return prepared.encoded.input_len + len(out)


# How clients send the call back: re-serialized the same (canonical JSON suffices), or with the
# content itself changed (only the payload cache brings the sampled call back).
SAME = {"command": "echo é > a.txt", "timeout": 5}
REWRITTEN = {"command": "echo é > a.txt"}  # the client dropped a field it considers default


@pytest.mark.parametrize("api", ["anthropic", "openai-chat", "openai-responses"])
@pytest.mark.parametrize(("resent", "needs_cache"), [(SAME, False), (REWRITTEN, True)])
def test_a_resent_call_matches_the_stored_output(
    template: Qwen3Template, api: str, resent: dict[str, Any], needs_cache: bool
) -> None:
    arguments: Any = resent if api == "anthropic" else json.dumps(resent, indent=1, sort_keys=True)
    first_body, second_body = bodies(api, arguments)
    for cached in (True, False):
        ing = Ingestor(TrajectoryRecorder(InMemoryEventLog()), template, GenericHarness())
        stored = answer_first(ing, template, translate(api, first_body))
        if not cached:
            ing.payloads.forget("ex")  # what matching saw before the cache (or after a restart)
        prepared = ing.prepare("ex", "run", translate(api, second_body))
        prefix = prepared.encoded.prefix
        reused = prefix is not None and prefix.request_id == "r1" and prefix.offset == stored
        assert reused == (cached or not needs_cache), (api, cached)
        if cached:
            (call,) = prepared.request.messages[1].blocks
            assert isinstance(call, ToolUseBlock) and call.input_json == SAMPLED


def test_a_call_id_of_another_execution_is_refused_and_nothing_is_recorded(template: Qwen3Template) -> None:
    log = InMemoryEventLog()
    ing = Ingestor(TrajectoryRecorder(log), template, GenericHarness())
    first_body, second_body = bodies("openai-responses", SAMPLED)
    answer_first(ing, template, translate("openai-responses", first_body))
    before = len(log.read(0, limit=100))
    with pytest.raises(InvalidRequest, match="generated for another execution"):
        ing.prepare("other-ex", "run", translate("openai-responses", second_body))
    with pytest.raises(InvalidRequest, match="generated for another execution"):
        ing.match("other-ex", translate("openai-responses", second_body))
    assert len(log.read(0, limit=100)) == before


def test_payload_cache_restores_only_what_differs_and_forgets() -> None:
    cache = PayloadCache()
    cache.remember("ex", Message(Role.ASSISTANT, (ToolUseBlock("c1", "Bash", SAMPLED),)))
    request = ChatRequest(messages=(Message(Role.ASSISTANT, (ToolUseBlock("c1", "Bash", SAMPLED),)),))
    assert cache.restore("ex", request) is request and cache.restored == 0
    changed = ChatRequest(messages=(Message(Role.ASSISTANT, (ToolUseBlock("c1", "Bash", "{}"),)),))
    assert cache.restore("ex", changed).messages[0].blocks == (ToolUseBlock("c1", "Bash", SAMPLED),)
    assert cache.restored == 1
    cache.forget("ex")
    assert cache.restore("ex", changed) is changed and cache.restore("other", changed) is changed


# -- Claude Code's shapes ------------------------------------------------------------------------

ENVIRONMENT = "# Environment\nYou have been invoked in the following environment: \n - Platform: linux\n"


def claude_body(system_message: Any, *later: dict[str, Any]) -> dict[str, Any]:
    return {
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": "Create a.txt"},
            {"role": "system", "content": system_message},
            *later,
        ],
    }


@pytest.mark.parametrize(
    "as_blocks",
    [
        [{"type": "text", "text": ENVIRONMENT, "cache_control": {"type": "ephemeral"}}],  # as captured
        [{"type": "text", "text": ENVIRONMENT[:20]}, {"type": "text", "text": ENVIRONMENT[20:]}],
    ],
)
def test_a_system_message_as_blocks_then_as_a_string_stays_the_main_agent_on_one_prefix(
    template: Qwen3Template, as_blocks: list[dict[str, Any]]
) -> None:
    ing = Ingestor(TrajectoryRecorder(InMemoryEventLog()), template, ClaudeCodeHarness())
    first = translate("anthropic", claude_body(as_blocks))
    stored = answer_first(ing, template, first)
    use = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": SAME}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}
    second = translate(
        "anthropic",
        claude_body(
            ENVIRONMENT, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}
        ),
    )
    assert second.system == first.system
    prepared = ing.prepare("ex", "run", second)
    assert prepared.traits.agent_kind is AgentKind.MAIN
    assert prepared.encoded.prefix is not None and prepared.encoded.prefix.offset == stored


def test_a_claude_code_sub_agent_whose_prompt_follows_a_reminder_block_is_linked() -> None:
    harness = ClaudeCodeHarness()
    spawn = ToolUseBlock("toolu_agent", "Agent", '{"description": "check", "prompt": "List the files."}')
    harness.observe_output("ex", Message(Role.ASSISTANT, (spawn,)))
    ctx = ExecutionContext("ex")
    ctx.first_system_sha = "main-sha"
    first_user = Message(
        Role.USER,
        (TextBlock("<system-reminder>\nAttribution...\n</system-reminder>"), TextBlock("List the files.")),
    )
    traits = harness.classify(ctx, ChatRequest(system="sub", messages=(first_user,)), "sub-sha")
    assert traits.agent_kind is AgentKind.SUB_AGENT and traits.spawned_by == "toolu_agent"
