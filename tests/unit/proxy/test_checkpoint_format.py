"""The recorded ids of a request equal what the checkpoint's own tokenizer and chat template give.

For each family's tiny checkpoint (``tests/checkpoints.py``), each conversation is sent through
each of the three APIs and encoded by the proxy's ``ChatFormat`` for that checkpoint; the
expected ids come from Hugging Face ``transformers`` alone: ``AutoTokenizer.from_pretrained``
on the folder, ``apply_chat_template(messages, tools=..., tokenize=True,
add_generation_prompt=True)``. Then: a history extended by a sampled answer keeps the sampled
tokens and renders only what is new; the template's markup is single ids while the same markup
in a harness's text stays text; a checkpoint that cannot be loaded gets a one-line error naming
its file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gyre_proxy.answer import JsonToolCallParser, parser_for
from gyre_proxy.chat import Message, Role, TextBlock, ThinkingBlock, ToolUseBlock
from gyre_proxy.engines import FinishKind
from gyre_proxy.exceptions import CheckpointLoadError, TemplateNotIncremental
from gyre_proxy.harness import GenericHarness
from gyre_proxy.ingest import Ingestor, JinjaChatFormat, encode_request, load_chat_format
from gyre_store import InMemoryEventLog
from gyre_store.catalog import CallFinish
from gyre_store.trees import ExecutionContext, TrajectoryRecorder
from tests.checkpoints import family_checkpoint, template_ids, template_text  # noqa: F401
from tests.unit.proxy.three_apis import APIS, translate

FAMILIES = ("qwen3", "qwen3.6", "llama3")
SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "é ok"}},
    "required": ["command"],
}
O_TOOLS = [
    {"type": "function", "function": {"name": "Bash", "description": "Run a command.", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "Read", "description": "Read a file.", "parameters": SCHEMA}},
]


def call(i: str, name: str, command: str) -> dict[str, Any]:
    return {
        "id": i,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps({"command": command})},
    }


# Conversations in the OpenAI Chat Completions shape (what chat templates take), each with the
# thinking switch of the request. Reasoning is only on an assistant turn after the last user
# message, where Qwen3's template keeps it too.
CONVERSATIONS: dict[str, tuple[dict[str, Any], bool]] = {
    "system and user": ({"messages": [{"role": "system", "content": "Be careful."}, {"role": "user", "content": "Hello"}]}, False),
    "user only, thinking on": ({"messages": [{"role": "user", "content": "Hello"}]}, True),
    "tools without a system prompt": ({"messages": [{"role": "user", "content": "Hi"}], "tools": O_TOOLS}, False),
    "two tools, two calls, two results": ({"tools": O_TOOLS, "messages": [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "List and read."},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call("c1", "Bash", "ls"), call("c2", "Read", "a.txt")]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "hello <b>world</b>"},
    ]}, False),
    "assistant text between user turns": ({"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
    ]}, True),
    "reasoning after the last user turn": ({"tools": O_TOOLS, "messages": [
        {"role": "user", "content": "Count files."},
        {"role": "assistant", "content": "", "reasoning_content": "Use ls.", "tool_calls": [call("c1", "Bash", "ls | wc -l")]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
    ]}, True),
}  # fmt: skip


def in_api(api: str, conversation: dict[str, Any], thinking: bool) -> dict[str, Any]:
    """The conversation as ``api`` sends it."""
    if api == "openai-chat":
        body = dict(conversation)
        return {**body, "reasoning_effort": "high"} if thinking else body
    if api == "anthropic":
        return _anthropic(conversation, thinking)
    return _responses(conversation, thinking)


def _anthropic(conversation: dict[str, Any], thinking: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": []}
    messages = body["messages"]
    for m in conversation["messages"]:
        if m["role"] == "system":
            body["system"] = m["content"]
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if messages and messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], list):
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": "user", "content": [block]})
        elif m["role"] == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.get("reasoning_content"):
                blocks.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": "s"})
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            for c in m.get("tool_calls", []):
                f = c["function"]
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": c["id"],
                        "name": f["name"],
                        "input": json.loads(f["arguments"]),
                    }
                )
            messages.append({"role": "assistant", "content": blocks})
        else:
            messages.append({"role": "user", "content": m["content"]})
    if conversation.get("tools"):
        body["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in conversation["tools"]
        ]
    if thinking:
        body["thinking"] = {"type": "enabled", "budget_tokens": 100}
    return body


def _responses(conversation: dict[str, Any], thinking: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"input": []}
    items = body["input"]
    for m in conversation["messages"]:
        if m["role"] == "system":
            body["instructions"] = m["content"]
        elif m["role"] == "tool":
            items.append(
                {"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]}
            )
        elif m["role"] == "assistant":
            if m.get("reasoning_content"):
                items.append(
                    {
                        "type": "reasoning",
                        "summary": [{"type": "summary_text", "text": m["reasoning_content"]}],
                    }
                )
            if m.get("content"):
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": m["content"]}],
                    }
                )
            for c in m.get("tool_calls", []):
                f = c["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": c["id"],
                        "name": f["name"],
                        "arguments": f["arguments"],
                    }
                )
        else:
            items.append(
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": m["content"]}]}
            )
    if conversation.get("tools"):
        body["tools"] = [{"type": "function", **t["function"]} for t in conversation["tools"]]
    if thinking:
        body["reasoning"] = {"effort": "high"}
    return body


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(
    request: pytest.FixtureRequest,
    family_checkpoint: Callable[[str], Path],  # noqa: F811
) -> tuple[str, Path, JinjaChatFormat, Any]:
    from transformers import AutoTokenizer

    folder = family_checkpoint(request.param)
    return request.param, folder, load_chat_format(folder), AutoTokenizer.from_pretrained(str(folder))


def official_ids(hf: Any, conversation: dict[str, Any], thinking: bool) -> list[int]:
    return template_ids(hf, conversation["messages"], conversation.get("tools"), thinking=thinking)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("case", list(CONVERSATIONS))
def test_recorded_ids_equal_the_checkpoints_apply_chat_template(checkpoint: Any, case: str, api: str) -> None:
    _, _, fmt, hf = checkpoint
    conversation, thinking = CONVERSATIONS[case]
    request = translate(api, in_api(api, conversation, thinking))
    recorded = encode_request(ExecutionContext("ex"), fmt, request).new_ids.tolist()
    expected = official_ids(hf, conversation, thinking)
    assert hf.decode(recorded) == hf.decode(expected)
    assert recorded == expected


def test_the_templates_markup_is_one_id_and_a_harnesss_markup_is_text(checkpoint: Any) -> None:
    _, _, fmt, hf = checkpoint
    tags = [
        t
        for t in ("<|im_start|>", "<|im_end|>", "<tool_call>", "<|eot_id|>", "<|start_header_id|>")
        if t in fmt.tok.specials
    ]
    injected = " and ".join(tags) + " obey"
    conversation = {"messages": [{"role": "user", "content": injected}], "tools": O_TOOLS}
    request = translate("openai-chat", {"messages": conversation["messages"], "tools": conversation["tools"]})
    recorded = encode_request(ExecutionContext("ex"), fmt, request).new_ids.tolist()
    # The harness's words are text: decoding gives them back, and they are the plain encoding.
    assert injected in hf.decode(recorded)
    plain = fmt.tok.encode(injected)
    assert any(recorded[i : i + len(plain)] == plain for i in range(len(recorded)))
    # The template's own markup: every added token the template writes is its one id (no
    # harness text here spells one, so the official ids are those of the neutral message).
    neutral = {"messages": [{"role": "user", "content": "x"}], "tools": O_TOOLS}
    ids = encode_request(ExecutionContext("ex"), fmt, translate("openai-chat", neutral)).new_ids.tolist()
    assert ids == official_ids(hf, neutral, False)
    specials = set(fmt.tok.specials.values())
    assert sum(i in specials for i in recorded) == sum(i in specials for i in ids)


def test_a_sampled_answer_is_kept_and_only_new_messages_are_rendered(checkpoint: Any) -> None:
    """Turn 2 extends turn 1's input and sampled tokens verbatim; its new ids are the template's
    text for the tool result and the generation prompt, as the whole conversation renders them."""
    _, _, fmt, hf = checkpoint
    recorder = TrajectoryRecorder(InMemoryEventLog())
    ingestor = Ingestor(recorder, fmt, GenericHarness())
    first = {
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "List."}],
        "tools": O_TOOLS,
    }
    p1 = ingestor.prepare("ex", "run", translate("openai-chat", first))
    assistant = Message(
        Role.ASSISTANT, (TextBlock("Looking."), ToolUseBlock("c1", "Bash", '{"command": "ls"}'))
    )
    sampled = fmt.render_output(assistant).ids
    ingestor.record(
        p1, request_id="r1", output_ids=np.asarray(sampled, np.int32),
        output_logprobs=np.zeros(len(sampled), np.float32), assistant=assistant, finish=CallFinish.STOP,
    )  # fmt: skip
    assert sampled[-1] in fmt.end_ids
    history = [
        *first["messages"],
        {"role": "assistant", "content": "Looking.", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]  # fmt: skip
    p2 = ingestor.prepare("ex", "run", translate("openai-chat", {"messages": history, "tools": O_TOOLS}))
    assert p2.encoded.prefix is not None and p2.encoded.prefix_len == len(p1.encoded.new_ids) + len(sampled)
    whole = template_text(hf, history, O_TOOLS)
    # The new text starts after the end token of the third turn (system, user, assistant).
    end_tokens = [hf.convert_ids_to_tokens(i) for i in fmt.end_ids]
    ends = sorted(p + len(t) for t in end_tokens for p in range(len(whole)) if whole.startswith(t, p))
    end = ends[2]
    new_text = whole[end:]
    assert hf.decode(p2.encoded.new_ids.tolist()) == new_text
    assert p2.encoded.new_ids.tolist() == hf.encode(new_text, add_special_tokens=False)
    assert p2.encoded.tokenized == len(p2.encoded.new_ids)


def test_the_familys_parser_reads_its_own_output(checkpoint: Any) -> None:
    _, _, fmt, _ = checkpoint
    assistant = Message(Role.ASSISTANT, (ToolUseBlock("c1", "Bash", '{"command": "ls -la"}'),))
    ids = [i for i in fmt.render_output(assistant).ids if i not in fmt.stop_ids]
    parser = parser_for(fmt.family)(thinking_open=fmt.opens_thinking(True))
    parser.feed(fmt.tok.decode(ids))
    parser.finish(FinishKind.STOP, input_tokens=1, output_tokens=len(ids))
    *thoughts, block = parser.blocks
    assert all(isinstance(b, ThinkingBlock) and not b.thinking.strip() for b in thoughts)
    assert (
        isinstance(block, ToolUseBlock)
        and block.name == "Bash"
        and json.loads(block.input_json) == {"command": "ls -la"}
    )
    assert (fmt.family == "llama3") == isinstance(parser, JsonToolCallParser)


# -- checkpoints that cannot be used ----------------------------------------------------------


@pytest.fixture
def copy_of(tmp_path: Path, family_checkpoint: Callable[[str], Path]) -> Path:  # noqa: F811
    target = tmp_path / "ck"
    shutil.copytree(family_checkpoint("qwen3"), target)
    return target


def test_a_missing_tokenizer_is_named(copy_of: Path) -> None:
    (copy_of / "tokenizer.json").unlink()
    with pytest.raises(CheckpointLoadError, match=r"tokenizer\.json") as info:
        load_chat_format(copy_of)
    assert "\n" not in str(info.value)


def test_a_broken_template_is_named_with_its_line(copy_of: Path) -> None:
    (copy_of / "chat_template.jinja").write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    with pytest.raises(CheckpointLoadError, match=r"chat_template\.jinja.*line 2") as info:
        load_chat_format(copy_of)
    assert "\n" not in str(info.value)


def test_a_tokenizer_larger_than_the_embedding_is_refused_with_both_numbers(copy_of: Path) -> None:
    config = json.loads((copy_of / "config.json").read_text())
    config["vocab_size"] = 1000
    (copy_of / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointLoadError, match=r"151669 ids .* 1000 rows"):
        load_chat_format(copy_of)


def test_a_template_that_rewrites_its_past_is_refused_naming_the_message(copy_of: Path) -> None:
    # Every turn carries the number of messages: adding one changes all that came before.
    (copy_of / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }} {{ messages|length }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fmt = load_chat_format(copy_of)
    request = translate(
        "openai-chat",
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ]
        },
    )
    # Detected once a turn other than the last before the new message changed: at message 3.
    with pytest.raises(TemplateNotIncremental, match="message 3"):
        encode_request(ExecutionContext("ex"), fmt, request)
