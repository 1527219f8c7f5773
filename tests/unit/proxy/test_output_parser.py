"""The Qwen3 output parser: examples of each rule, and properties over arbitrary text."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gyre_proxy.answer.output_parser import (
    JsonToolCallParser,
    OutputParser,
    _held_prefix,
    new_tool_use_id,
    parse_output,
)
from gyre_proxy.chat import (
    Block,
    BlockKind,
    BlockStart,
    BlockStop,
    MessageDone,
    StopReason,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolInputDelta,
    ToolUseBlock,
)
from gyre_proxy.engines import FinishKind


def ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"toolu_{next(counter)}"


def one_shot(text: str, **kwargs: bool) -> tuple[Block, ...]:
    return parse_output(text, id_factory=ids(), **kwargs).blocks


def incremental(chunks: list[str], **kwargs: bool) -> tuple[tuple[Block, ...], list[StreamEvent]]:
    parser = OutputParser(id_factory=ids(), **kwargs)
    events = [e for chunk in chunks for e in parser.feed(chunk)]
    events += parser.finish(FinishKind.STOP, input_tokens=1, output_tokens=2)
    return parser.blocks, events


def blocks_from_events(events: list[StreamEvent]) -> tuple[Block, ...]:
    """Rebuild blocks the way a client does from the stream."""
    open_: dict[int, list[str]] = {}
    starts: dict[int, BlockStart] = {}
    out: list[Block] = []
    for e in events:
        if isinstance(e, BlockStart):
            starts[e.index], open_[e.index] = e, []
        elif isinstance(e, TextDelta | ThinkingDelta | ToolInputDelta):
            open_[e.index].append(
                e.text
                if isinstance(e, TextDelta)
                else e.thinking
                if isinstance(e, ThinkingDelta)
                else e.partial_json
            )
        elif isinstance(e, BlockStop):
            start, text = starts[e.index], "".join(open_.pop(e.index))
            if start.kind is BlockKind.TEXT:
                out.append(TextBlock(text))
            elif start.kind is BlockKind.THINKING:
                out.append(ThinkingBlock(text))
            else:
                out.append(ToolUseBlock(start.tool_use_id, start.tool_name, text))
    assert not open_, "every started block is stopped"
    return tuple(out)


QWEN_TURN = (
    "<think>\nThe user wants files.\n</think>\n\nLet me look.\n\n"
    '<tool_call>\n{"name": "Bash", "arguments": {"command":  "ls -la",  "timeout": 5}}\n</tool_call>\n'
    '<tool_call>\n{"name": "Read", "arguments": {"path": "a.py"}}\n</tool_call>'
)


def test_a_qwen3_turn_with_reasoning_text_and_two_tool_calls() -> None:
    response = parse_output(QWEN_TURN, id_factory=ids(), input_tokens=3, output_tokens=4)
    assert response.blocks == (
        ThinkingBlock("The user wants files."),
        TextBlock("Let me look."),
        ToolUseBlock("toolu_0", "Bash", '{"command":  "ls -la",  "timeout": 5}'),
        ToolUseBlock("toolu_1", "Read", '{"path": "a.py"}'),
    )
    assert response.stop_reason is StopReason.TOOL_USE and (
        response.input_tokens,
        response.output_tokens,
    ) == (3, 4)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "x", "arguments": {bad}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "x", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "x", "arguments": {}}',
        "<tool_call>",
        "</tool_call> <think>x</think>",
    ],
)
def test_malformed_markup_stays_text(text: str) -> None:
    response = parse_output("before " + text, id_factory=ids())
    assert response.blocks == (TextBlock(("before " + text).strip()),)
    assert response.stop_reason is StopReason.END_TURN


def test_missing_arguments_mean_an_empty_object() -> None:
    assert one_shot('<tool_call>{"name": "Stop"}</tool_call>') == (ToolUseBlock("toolu_0", "Stop", "{}"),)


def test_reasoning_rules() -> None:
    assert one_shot("<think>a</think>b") == (ThinkingBlock("a"), TextBlock("b"))
    assert one_shot("  <think>unclosed") == (ThinkingBlock("unclosed"),)
    assert one_shot("x <think>a</think>") == (TextBlock("x <think>a</think>"),)
    # The template opened <think> in the prompt: reasoning runs from the start.
    assert one_shot("a</think>b", thinking_open=True) == (ThinkingBlock("a"), TextBlock("b"))
    assert one_shot("<think>a</think>b", thinking_open=True) == (ThinkingBlock("a"), TextBlock("b"))
    assert one_shot("a</think>b") == (TextBlock("a</think>b"),)
    assert one_shot("<think>\n\n</think>\n\nhi") == (TextBlock("hi"),)


@pytest.mark.parametrize(
    ("finish", "stop_sequence", "expected"),
    [
        (FinishKind.STOP, None, StopReason.END_TURN),
        (FinishKind.LENGTH, None, StopReason.MAX_TOKENS),
        (FinishKind.STOP, "END", StopReason.STOP_SEQUENCE),
    ],
)
def test_stop_reason_from_the_engine_finish(
    finish: FinishKind, stop_sequence: str | None, expected: StopReason
) -> None:
    response = parse_output("text", finish=finish, stop_sequence=stop_sequence)
    assert response.stop_reason is expected and response.stop_sequence == stop_sequence
    with_tool = parse_output(
        '<tool_call>{"name": "a"}</tool_call>', finish=finish, stop_sequence=stop_sequence
    )
    assert with_tool.stop_reason is StopReason.TOOL_USE and with_tool.stop_sequence is None


def test_streaming_holds_back_only_what_may_be_a_tag() -> None:
    parser = OutputParser(id_factory=ids())
    assert parser.feed("Hello <tool") == [BlockStart(0, BlockKind.TEXT), TextDelta(0, "Hello")]
    assert parser.feed("box> more") == [TextDelta(0, " <toolbox> more")]
    events = parser.feed(' <tool_call>{"name": "f", "arguments": {"k": 1}}</tool_call>')
    assert events == [
        BlockStop(0),
        BlockStart(1, BlockKind.TOOL_USE, tool_use_id="toolu_0", tool_name="f"),
        ToolInputDelta(1, '{"k": 1}'),
        BlockStop(1),
    ]
    assert parser.finish(FinishKind.STOP, input_tokens=5, output_tokens=6) == [
        MessageDone(StopReason.TOOL_USE, 5, 6)
    ]


def test_generated_ids_have_anthropic_shape() -> None:
    first, second = new_tool_use_id(), new_tool_use_id()
    assert first != second and first.startswith("toolu_") and len(first) == 30
    assert all(c.isalnum() or c in "_-" for c in first)


# -- properties ---------------------------------------------------------------------------------

FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<",
    "</",
    "\n",
    " ",
    "{",
    "}",
    '"name"',
    ":",
    '"a"',
    "x",
    "é",
]
texty = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=25).map("".join)


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in itertools.pairwise([0, *points, len(text)])]


@settings(max_examples=300)
@given(text=texty, cuts=st.lists(st.integers(min_value=0), max_size=12), thinking_open=st.booleans())
def test_any_chunking_gives_the_one_shot_blocks(text: str, cuts: list[int], thinking_open: bool) -> None:
    expected = one_shot(text, thinking_open=thinking_open)
    blocks, events = incremental(chunked(text, cuts), thinking_open=thinking_open)
    assert blocks == expected
    assert blocks_from_events(events) == expected
    assert isinstance(events[-1], MessageDone)
    assert all(b.text.strip() == b.text and b.text for b in expected if isinstance(b, TextBlock))


@settings(max_examples=200)
@given(text=st.text(max_size=200))
def test_arbitrary_text_never_raises(text: str) -> None:
    response = parse_output(text)
    assert all(isinstance(b, TextBlock | ThinkingBlock | ToolUseBlock) for b in response.blocks)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200)
@given(
    calls=st.lists(
        st.tuples(
            st.text(min_size=1, max_size=10).filter(str.strip),
            st.dictionaries(st.text(max_size=6), json_values, max_size=4),
            st.sampled_from([None, 2]),
        ),
        min_size=1,
        max_size=3,
    ),
    preface=st.text(max_size=20).filter(lambda s: "<" not in s),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_well_formed_tool_calls_round_trip(
    calls: list[tuple[str, dict[str, object], int | None]], preface: str, cuts: list[int]
) -> None:
    rendered = [json.dumps(args, indent=indent, ensure_ascii=False) for _, args, indent in calls]
    text = preface + "".join(
        f'\n<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {raw}}}\n</tool_call>'
        for (name, _, _), raw in zip(calls, rendered, strict=True)
    )
    blocks, _ = incremental(chunked(text, cuts))
    expected_text = (TextBlock(preface.strip()),) if preface.strip() else ()
    assert blocks == expected_text + tuple(
        ToolUseBlock(f"toolu_{i}", name, raw)
        for i, ((name, _, _), raw) in enumerate(zip(calls, rendered, strict=True))
    )
    assert all(
        json.loads(b.input_json) == args
        for b, (_, args, _) in zip(blocks[len(expected_text) :], calls, strict=True)
    )


# -- the other families' syntax ----------------------------------------------------------------


def _blocks_of(parser: Any, chunks: list[str]) -> tuple[Any, ...]:
    for chunk in chunks:
        parser.feed(chunk)
    parser.finish(FinishKind.STOP, input_tokens=1, output_tokens=1)
    return tuple(parser.blocks)


def test_qwen35_xml_tool_calls_are_parsed() -> None:
    text = "<tool_call>\n<function=Write>\n<parameter=path>\na.txt\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"
    (block,) = parse_output(text).blocks
    assert isinstance(block, ToolUseBlock) and block.name == "Write"
    assert json.loads(block.input_json) == {"path": "a.txt", "n": 3}


@pytest.mark.parametrize("cut", [1, 3, 7])
def test_llama3_json_calls_text_and_malformed_calls(cut: int) -> None:
    def chunks(text: str) -> list[str]:
        return [text[i : i + cut] for i in range(0, len(text), cut)]

    calls = (
        '<|python_tag|>{"name": "Bash", "parameters": {"command": "ls"}}\n{"name": "Read", "arguments": {}}'
    )
    first, second = _blocks_of(JsonToolCallParser(), chunks(calls))
    assert (first.name, json.loads(first.input_json)) == ("Bash", {"command": "ls"})
    assert (second.name, second.input_json) == ("Read", "{}")
    (text,) = _blocks_of(JsonToolCallParser(), chunks("  The answer is 4.  "))
    assert isinstance(text, TextBlock) and text.text == "The answer is 4."
    (bad,) = _blocks_of(JsonToolCallParser(), chunks('{"name": "Bash", "parameters": '))
    assert isinstance(bad, TextBlock) and bad.text == '{"name": "Bash", "parameters":'


@settings(max_examples=300, deadline=None)
@example("x</think", "</think>")
@example("a<tool_cal", "<tool_call>")
@example("a<tool_call", "<tool_call>")
@example("text<", "<tool_call>")
@example("</tool_call", "</tool_call>")
@given(
    st.text(alphabet="<>/_tolcahk x\n", max_size=14),
    st.sampled_from(["<tool_call>", "</think>", "</tool_call>"]),
)
def test_held_prefix_is_the_longest_suffix_that_begins_the_tag(buf: str, tag: str) -> None:
    expected = max(
        (n for n in range(1, min(len(buf), len(tag) - 1) + 1) if tag.startswith(buf[-n:])), default=0
    )
    assert _held_prefix(buf, tag) == expected
