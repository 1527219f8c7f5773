"""Qwen3 output text into content blocks: reasoning, tool calls (Hermes format), plain text.

``OutputParser`` is fed text chunks as the engine streams them and returns ``StreamEvent``s;
``parse_output`` does the same in one shot. Both run the same state machine, so any chunking
gives the same blocks. Malformed markup is never an error: it stays in the text. Rules:

- Reasoning. Output that starts (after whitespace) with ``<think>`` is reasoning up to the
  first ``</think>``, or to the end when unclosed. With ``thinking_open`` (the request had
  thinking on and the chat template may have opened ``<think>`` in the prompt, as Qwen3
  thinking templates do) the output is reasoning from its start, a leading ``<think>`` is
  skipped. Any other ``<think>`` or ``</think>`` is plain text.
- Tool calls. ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number, each
  a ``ToolUseBlock`` whose ``input_json`` is the arguments object's text exactly as sampled.
  Bad JSON, a missing or empty name, non-object arguments or a missing ``</tool_call>`` leave
  the whole span as text; missing ``arguments`` means ``{}``.
- Text. Everything else; each block is stripped of surrounding whitespace and whitespace-only
  blocks are dropped, so the newlines Qwen3 puts around its tags never reach the harness.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable

import msgspec

from gyre_proxy.chat import (
    Block,
    BlockKind,
    BlockStart,
    BlockStop,
    ChatResponse,
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

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def new_tool_use_id() -> str:
    """``toolu_`` and 24 URL-safe random characters (Anthropic's shape; OpenAI accepts it)."""
    return "toolu_" + secrets.token_urlsafe(18)


class _ToolCall(msgspec.Struct):
    name: str
    arguments: msgspec.Raw = msgspec.Raw(b"{}")


_tool_call_decoder = msgspec.json.Decoder(_ToolCall)


FUNCTION_OPEN = "<function="
PARAMETER_OPEN = "<parameter="


def parse_xml_tool_call(body: str) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` from Qwen3.5/3.6's form, or None if malformed::

        <function=NAME>
        <parameter=KEY>
        VALUE
        </parameter>
        </function>

    A value that parses as JSON other than a string (a number, an object) is that value;
    anything else is the text, as the template writes strings unquoted."""
    text = body.strip()
    if not text.startswith(FUNCTION_OPEN) or not text.endswith("</function>"):
        return None
    head, _, rest = text[len(FUNCTION_OPEN) :].partition(">")
    name = head.strip()
    rest = rest[: -len("</function>")]
    arguments: dict[str, object] = {}
    while rest.strip():
        rest = rest.lstrip("\n")
        if not rest.startswith(PARAMETER_OPEN):
            return None
        key, _, rest = rest[len(PARAMETER_OPEN) :].partition(">")
        value, found, rest = rest.partition("</parameter>")
        if not found or not key.strip():
            return None
        value = value.removeprefix("\n").removesuffix("\n")
        try:
            parsed = msgspec.json.decode(value.encode())
        except msgspec.DecodeError:
            parsed = value
        arguments[key.strip()] = value if isinstance(parsed, str) else parsed
    if not name or "\n" in name:
        return None
    return name, json.dumps(arguments, ensure_ascii=False)  # as a template's tojson writes it


def parse_tool_call(body: str) -> tuple[str, str] | None:
    """``(name, raw arguments JSON)`` from the text between the tags, or None if malformed:
    Hermes JSON (``{"name": ..., "arguments": {...}}``) or Qwen3.5/3.6's XML form."""
    if body.lstrip().startswith(FUNCTION_OPEN):
        return parse_xml_tool_call(body)
    try:
        call = _tool_call_decoder.decode(body.encode())
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    raw = bytes(call.arguments).decode()
    if not call.name.strip() or not raw.startswith("{"):
        return None
    return call.name, raw


def _held_prefix(buf: str, tag: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``tag``."""
    if not buf or buf[-1] not in tag[:-1]:
        return 0  # every such suffix ends with a character of the tag's proper prefixes
    for n in range(min(len(buf), len(tag) - 1), 0, -1):
        if tag.startswith(buf[-n:]):
            return n
    return 0


class _Segment:
    """One text or thinking block being written: stripped at both ends, opened lazily."""

    def __init__(self, kind: BlockKind, index: int) -> None:
        self.kind = kind
        self.index = index
        self.started = False
        self.text: list[str] = []
        self._ws = ""  # trailing whitespace held back until more text follows

    def push(self, text: str, out: list[StreamEvent]) -> None:
        if not self.started:
            text = text.lstrip()
            if not text:
                return
            self.started = True
            out.append(BlockStart(self.index, self.kind))
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body) :]
        if body:
            self.text.append(body)
            out.append(
                TextDelta(self.index, body)
                if self.kind is BlockKind.TEXT
                else ThinkingDelta(self.index, body)
            )

    def close(self, out: list[StreamEvent]) -> Block | None:
        if not self.started:
            return None
        out.append(BlockStop(self.index))
        text = "".join(self.text)
        return TextBlock(text) if self.kind is BlockKind.TEXT else ThinkingBlock(text)


class _BlockWriter:
    """What every output parser shares: the blocks closed so far, the text or thinking block
    being written, tool-use blocks, and the ``MessageDone`` that ends the output. A subclass
    gives ``flush``."""

    def __init__(self, id_factory: Callable[[], str]) -> None:
        self._new_id = id_factory
        self._buf = ""
        self._segment: _Segment | None = None
        self._blocks: list[Block] = []
        self._finished = False

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The blocks closed so far (all of them after ``finish``)."""
        return tuple(self._blocks)

    @property
    def has_tool_use(self) -> bool:
        return any(isinstance(b, ToolUseBlock) for b in self._blocks)

    def flush(self) -> list[StreamEvent]:
        raise NotImplementedError

    def finish(
        self,
        finish: FinishKind,
        *,
        input_tokens: int,
        output_tokens: int,
        stop_sequence: str | None = None,
    ) -> list[StreamEvent]:
        """Flush held text, close the open block and end with ``MessageDone``."""
        out = self.flush()
        reason, seq = stop_reason_for(finish, has_tool_use=self.has_tool_use, stop_sequence=stop_sequence)
        out.append(MessageDone(reason, input_tokens, output_tokens, seq))
        return out

    def _segment_for(self, kind: BlockKind) -> _Segment:
        if self._segment is None:
            self._segment = _Segment(kind, len(self._blocks))
        return self._segment

    def _close_segment(self, out: list[StreamEvent]) -> None:
        if self._segment is None:
            return
        block = self._segment.close(out)
        if block is not None:
            self._blocks.append(block)
        self._segment = None

    def _tool_use(self, name: str, arguments: str, out: list[StreamEvent]) -> None:
        """A complete tool call: its block opened, its whole input, closed."""
        index, tool_id = len(self._blocks), self._new_id()
        out.append(BlockStart(index, BlockKind.TOOL_USE, tool_use_id=tool_id, tool_name=name))
        out.append(ToolInputDelta(index, arguments))
        out.append(BlockStop(index))
        self._blocks.append(ToolUseBlock(tool_id, name, arguments))


class OutputParser(_BlockWriter):
    """Incremental parser: ``feed`` text chunks, then ``finish`` once; see the module rules."""

    def __init__(
        self, *, thinking_open: bool = False, id_factory: Callable[[], str] = new_tool_use_id
    ) -> None:
        super().__init__(id_factory)
        self._thinking_open = thinking_open
        self._state = "start"  # start | think | text | tool
        self._scanned = 0  # how far the open tool call's text was searched for its end tag

    # -- public ------------------------------------------------------------------------------

    def feed(self, chunk: str) -> list[StreamEvent]:
        """Events for ``chunk``; text that may begin a tag is held back until it is decided."""
        if self._finished:
            raise RuntimeError("OutputParser.feed after finish")
        self._buf += chunk
        out: list[StreamEvent] = []
        while self._step(out, final=False):
            pass
        return out

    def flush(self) -> list[StreamEvent]:
        """End of output: everything still held is decided as if no more text could come."""
        out: list[StreamEvent] = []
        if self._finished:
            return out
        while self._step(out, final=True):
            pass
        self._close_segment(out)
        self._finished = True
        return out

    # -- the state machine ----------------------------------------------------------------------

    def _step(self, out: list[StreamEvent], *, final: bool) -> bool:
        """Consume what can be decided now; True if the state changed and another step may help."""
        if self._state == "start":
            return self._step_start(final)
        if self._state == "think":
            return self._step_think(out, final)
        if self._state == "text":
            return self._step_text(out, final)
        return self._step_tool(out, final)

    def _step_start(self, final: bool) -> bool:
        head = self._buf.lstrip()
        if not final and (not head or (THINK_OPEN.startswith(head) and head != THINK_OPEN)):
            return False  # cannot tell yet whether a <think> opens the output
        if head.startswith(THINK_OPEN):
            self._buf = head[len(THINK_OPEN) :]
            self._state = "think"
        else:
            self._state = "think" if self._thinking_open else "text"
        return True

    def _step_think(self, out: list[StreamEvent], final: bool) -> bool:
        segment = self._segment_for(BlockKind.THINKING)
        end = self._buf.find(THINK_CLOSE)
        if end >= 0:
            segment.push(self._buf[:end], out)
            self._buf = self._buf[end + len(THINK_CLOSE) :]
            self._close_segment(out)
            self._state = "text"
            return True
        keep = 0 if final else _held_prefix(self._buf, THINK_CLOSE)
        segment.push(self._buf[: len(self._buf) - keep], out)
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _step_text(self, out: list[StreamEvent], final: bool) -> bool:
        segment = self._segment_for(BlockKind.TEXT)
        start = self._buf.find(TOOL_OPEN)
        if start >= 0:
            segment.push(self._buf[:start], out)
            self._buf = self._buf[start + len(TOOL_OPEN) :]
            self._state = "tool"
            return True
        keep = 0 if final else _held_prefix(self._buf, TOOL_OPEN)
        segment.push(self._buf[: len(self._buf) - keep], out)
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _step_tool(self, out: list[StreamEvent], final: bool) -> bool:
        # Long tool calls (a file being written) arrive a token at a time: search only the
        # new text, so a call costs linear rather than quadratic time.
        end = self._buf.find(TOOL_CLOSE, self._scanned)
        if end < 0:
            self._scanned = max(0, len(self._buf) - len(TOOL_CLOSE) + 1)
            if final:  # unterminated: the tag and all after it are text
                self._segment_for(BlockKind.TEXT).push(TOOL_OPEN + self._buf, out)
                self._buf = ""
                self._state = "text"
                self._scanned = 0
            return False
        body = self._buf[:end]
        self._buf = self._buf[end + len(TOOL_CLOSE) :]
        self._state = "text"
        self._scanned = 0
        parsed = parse_tool_call(body)
        if parsed is None:
            self._segment_for(BlockKind.TEXT).push(TOOL_OPEN + body + TOOL_CLOSE, out)
            return True
        self._close_segment(out)
        self._tool_use(*parsed, out)
        return True


def stop_reason_for(
    finish: FinishKind, *, has_tool_use: bool, stop_sequence: str | None = None
) -> tuple[StopReason, str | None]:
    """tool_use if a call parsed; else a matched stop sequence, max_tokens on length, end_turn.

    An ABORT finish is reported as end_turn: the answer pipeline retries aborted requests
    itself and should not let one reach the parser.
    """
    if has_tool_use:
        return StopReason.TOOL_USE, None
    if stop_sequence is not None:
        return StopReason.STOP_SEQUENCE, stop_sequence
    if finish is FinishKind.LENGTH:
        return StopReason.MAX_TOKENS, None
    return StopReason.END_TURN, None


def parse_output(
    text: str,
    *,
    finish: FinishKind = FinishKind.STOP,
    input_tokens: int = 0,
    output_tokens: int = 0,
    stop_sequence: str | None = None,
    thinking_open: bool = False,
    id_factory: Callable[[], str] = new_tool_use_id,
) -> ChatResponse:
    """One-shot parse of a whole sampled output into a ``ChatResponse``."""
    parser = OutputParser(thinking_open=thinking_open, id_factory=id_factory)
    parser.feed(text)
    parser.flush()
    reason, seq = stop_reason_for(finish, has_tool_use=parser.has_tool_use, stop_sequence=stop_sequence)
    return ChatResponse(
        blocks=parser.blocks,
        stop_reason=reason,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        stop_sequence=seq,
    )


PYTHON_TAG = "<|python_tag|>"


class _JsonCall(msgspec.Struct):
    name: str
    parameters: msgspec.Raw = msgspec.Raw(b"")
    arguments: msgspec.Raw = msgspec.Raw(b"")


_json_call_decoder = msgspec.json.Decoder(_JsonCall)


def parse_json_tool_call(text: str) -> tuple[str, str] | None:
    """``(name, raw arguments JSON)`` from a Llama 3 style call ``{"name": ..., "parameters": {...}}``
    (``arguments`` is accepted too), or None if ``text`` is not one."""
    try:
        call = _json_call_decoder.decode(text.strip().encode())
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    raw = bytes(call.parameters).decode() or bytes(call.arguments).decode() or "{}"
    if not call.name.strip() or not raw.startswith("{"):
        return None
    return call.name, raw


class JsonToolCallParser(_BlockWriter):
    """Llama 3 style output: text, or one tool call per line as a JSON object, optionally after
    ``<|python_tag|>``. Output that starts (after whitespace) with ``{`` or the tag is held until
    the end and becomes tool calls if every line parses as one, else text; any other output is
    text, streamed as it comes. Same interface as ``OutputParser``."""

    def __init__(self, *, id_factory: Callable[[], str] = new_tool_use_id) -> None:
        super().__init__(id_factory)
        self._mode = "start"  # start | text | call

    def feed(self, chunk: str) -> list[StreamEvent]:
        if self._finished:
            raise RuntimeError("JsonToolCallParser.feed after finish")
        self._buf += chunk
        out: list[StreamEvent] = []
        if self._mode == "start":
            head = self._buf.lstrip()
            if not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG):
                return out
            self._mode = "call" if head.startswith(("{", PYTHON_TAG)) else "text"
        if self._mode == "text":
            self._segment_for(BlockKind.TEXT).push(self._buf, out)
            self._buf = ""
        return out

    def flush(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if self._finished:
            return out
        self._finished = True
        if self._mode != "text":
            body = self._buf.strip()
            body = body[len(PYTHON_TAG) :] if body.startswith(PYTHON_TAG) else body
            lines = [line for line in body.split("\n") if line.strip()]
            calls = [call for line in lines if (call := parse_json_tool_call(line)) is not None]
            if lines and len(calls) == len(lines):
                for name, arguments in calls:
                    self._tool_use(name, arguments, out)
                return out
            self._segment_for(BlockKind.TEXT).push(self._buf, out)
        self._close_segment(out)
        return out


AnyOutputParser = OutputParser | JsonToolCallParser


def parser_for(family: str) -> Callable[..., AnyOutputParser]:
    """The output parser of a chat-template family, called with ``thinking_open``: ``qwen``
    (reasoning in ``<think>``, Hermes JSON or Qwen3.5/3.6 XML tool calls) or ``llama3`` (JSON
    tool calls); a plug-in per family."""
    factories: dict[str, Callable[..., AnyOutputParser]] = {
        "qwen": lambda thinking_open=False: OutputParser(thinking_open=thinking_open),
        "llama3": lambda thinking_open=False: JsonToolCallParser(),
    }
    try:
        return factories[family]
    except KeyError:
        raise ValueError(f"no output parser for the family {family!r}; one of {sorted(factories)}") from None
