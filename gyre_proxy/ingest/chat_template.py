"""Chat formats: how a conversation becomes token ids, one message at a time, with provenance.

``ChatFormat`` is what the proxy renders with. ``Qwen3Template`` is gyre's hand-written
Qwen3 template, the demo's default (with the bundled Qwen3.6 vocabulary);
``gyre_proxy.ingest.jinja_format.JinjaChatFormat`` runs a checkpoint's own template.

``Qwen3Template``: each message renders to ``[\\n] <|im_start|>role\\n content <|im_end|>``: the
newline that follows an ``<|im_end|>`` is written as the start of the next message, so every
message (and every sampled answer, which ends with ``<|im_end|>``) ends on a message boundary
and a history can be extended without re-rendering what is already stored. The text is what
Qwen3's official template writes for the same messages: tool definitions as ``json.dumps``
writes them (``", "`` and ``": "``), one newline before each ``<tool_call>``, tool results
as user turns of ``<tool_response>`` blocks, no system turn when there is neither a system
prompt nor a tool. The markup it writes that is an added token of the vocabulary
(``<|im_start|>``, ``<think>``, ``<tool_call>``, ...) is that one id; text from the harness
is encoded as text (``encode_pieces``). One deliberate difference: reasoning in earlier turns
is kept (the official template drops it), because a stored history keeps the tokens as they
were sampled.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import numpy as np

from gyre_proxy.chat import (
    ChatRequest,
    Message,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre_proxy.engines import Tokenizer, encode_pieces
from gyre_store.catalog import Provenance

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclass
class Rendered:
    """Token ids and their provenance, built piece by piece."""

    ids: list[int] = field(default_factory=list)
    prov: list[int] = field(default_factory=list)

    def add(self, ids: list[int], prov: Provenance) -> None:
        self.ids.extend(ids)
        self.prov.extend([int(prov)] * len(ids))

    def extend(self, other: Rendered) -> None:
        self.ids.extend(other.ids)
        self.prov.extend(other.prov)

    def __len__(self) -> int:
        return len(self.ids)


Piece = tuple[str, Provenance, bool]  # text, its provenance, whether the template wrote it


def render_pieces(tok: Tokenizer, pieces: Sequence[Piece]) -> Rendered:
    """``pieces`` encoded together (``encode_pieces``): markup's added tokens as single ids."""
    ids, owner = encode_pieces(tok, [(text, markup) for text, _, markup in pieces])
    provs = np.asarray([int(p) for _, p, _ in pieces] or [0], dtype=np.int64)
    return Rendered(ids, provs[owner].tolist() if len(ids) else [])


class ChatFormat(Protocol):
    """How the policy's conversations become token ids (see the module docstring)."""

    tok: Tokenizer
    family: str  # picks the output parser: "qwen" (Hermes tool calls) or "llama3"
    stop_ids: tuple[int, ...]  # ids that end a generation
    end_ids: frozenset[int]  # ids a complete answer ends with (a message boundary)

    def render_new(
        self, request: ChatRequest, messages: tuple[Message, ...], start: int
    ) -> tuple[list[Rendered], Rendered]:
        """``messages[start:]`` (``messages[0]`` is the system message) one Rendered each,
        given that ``messages[:start]`` are stored already, and the generation prompt."""
        ...

    def render_output(self, message: Message) -> Rendered:
        """What the model emits for an assistant message, its end token included."""
        ...

    def opens_thinking(self, thinking: bool) -> bool:
        """Whether the generation prompt opens a reasoning block the output continues
        (Qwen3.5/3.6 end it with ``<think>`` when thinking is on)."""
        ...


class Qwen3Template:
    """Renders messages, the generation prompt and (for synthetic traces) model outputs."""

    family = "qwen"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.im_start = tokenizer.special("<|im_start|>")
        self.im_end = tokenizer.special("<|im_end|>")
        self.stop_ids: tuple[int, ...] = (self.im_end, tokenizer.special("<|endoftext|>"))
        self.end_ids = frozenset({self.im_end})

    @staticmethod
    def _open(out: list[Piece], role: str, first: bool) -> None:
        out.append((("" if first else "\n") + f"<|im_start|>{role}\n", Provenance.TEMPLATE, True))

    def tools_text(self, tools: tuple[ToolSpec, ...]) -> str:
        """The tool section: each definition as the template's ``tojson`` writes it, which is
        ``json.dumps`` with its default separators, keys in the client's order, non-ASCII kept."""
        lines = [json.dumps(tool_definition(t), ensure_ascii=False) for t in tools]
        return TOOLS_PREAMBLE + "".join("\n" + line for line in lines) + TOOLS_POSTAMBLE

    @staticmethod
    def has_system(system: str, tools: tuple[ToolSpec, ...]) -> bool:
        """Whether the context opens with a system turn (the template writes none without
        a system prompt or a tool)."""
        return bool(system or tools)

    def render_new(
        self, request: ChatRequest, messages: tuple[Message, ...], start: int
    ) -> tuple[list[Rendered], Rendered]:
        # Without a system turn the first message opens the context (no newline before it).
        opens = 1 if not self.has_system(request.system, request.tools) else None
        parts = [
            self.render_system(request.system, request.tools)
            if i == 0
            else self.render_message(messages[i], first=i == opens)
            for i in range(start, len(messages))
        ]
        return parts, self.generation_prompt(thinking=request.thinking)

    def render_system(self, system: str, tools: tuple[ToolSpec, ...]) -> Rendered:
        if not self.has_system(system, tools):
            return Rendered()
        out: list[Piece] = []
        self._open(out, "system", first=True)
        out.append((system, Provenance.SYSTEM, False))
        if tools:
            # The section's tags are markup; the definitions come from the client (text).
            out.append(((("\n\n" if system else "") + TOOLS_PREAMBLE), Provenance.SYSTEM, True))
            for t in tools:
                out.append(("\n", Provenance.SYSTEM, True))
                out.append((json.dumps(tool_definition(t), ensure_ascii=False), Provenance.SYSTEM, False))
            out.append((TOOLS_POSTAMBLE, Provenance.SYSTEM, True))
        out.append(("<|im_end|>", Provenance.TEMPLATE, True))
        return render_pieces(self.tok, out)

    def render_message(self, message: Message, *, first: bool = False) -> Rendered:
        """One message of the history (the system message goes through render_system)."""
        out: list[Piece] = []
        if message.role == Role.ASSISTANT:
            self._open(out, "assistant", first)
            self._assistant_body(out, message, Provenance.INJECTED_ASSISTANT)
        elif message.role == Role.SYSTEM:
            # A system (developer) turn later in the history, where the client put it.
            self._open(out, "system", first)
            out.append((message.text(), Provenance.SYSTEM, False))
        else:
            self._open(out, "user", first)
            for i, b in enumerate(message.blocks):
                if i and isinstance(b, ToolResultBlock) != isinstance(message.blocks[i - 1], ToolResultBlock):
                    # Tool results and the user's own words are separate turns in the template.
                    out.append(("<|im_end|>", Provenance.TEMPLATE, True))
                    self._open(out, "user", first=False)
                elif i:
                    out.append(("\n", Provenance.TEMPLATE, True))
                if isinstance(b, ToolResultBlock):
                    out.append(("<tool_response>\n", Provenance.TEMPLATE, True))
                    out.append(
                        (b.content, Provenance.CRITIQUE if b.critique else Provenance.TOOL_RESULT, False)
                    )
                    out.append(("\n</tool_response>", Provenance.TEMPLATE, True))
                elif isinstance(b, TextBlock):
                    out.append((b.text, Provenance.CRITIQUE if b.critique else Provenance.USER, False))
        out.append(("<|im_end|>", Provenance.TEMPLATE, True))
        return render_pieces(self.tok, out)

    @staticmethod
    def _assistant_body(out: list[Piece], message: Message, prov: Provenance) -> None:
        wrote = False  # any text so far
        after_think = False
        for b in message.blocks:
            if isinstance(b, ThinkingBlock):
                out.append(("<think>\n", prov, True))
                out.append((b.thinking.strip(chr(10)), prov, False))
                out.append(("\n</think>\n\n", prov, True))
                wrote, after_think = True, True
                continue
            if isinstance(b, TextBlock):
                text = b.text.lstrip("\n") if after_think else b.text
                out.append((text, prov, False))
                wrote = wrote or bool(text)
            elif isinstance(b, ToolUseBlock):
                out.append((("\n" if wrote else "") + '<tool_call>\n{"name": ', prov, True))
                out.append((msgspec.json.encode(b.name).decode(), prov, False))
                out.append((', "arguments": ', prov, True))
                out.append((b.input_json, prov, False))
                out.append(("}\n</tool_call>", prov, True))
                wrote = True
            after_think = False

    def generation_prompt(self, *, thinking: bool) -> Rendered:
        out: list[Piece] = []
        self._open(out, "assistant", first=False)
        if not thinking:
            # Qwen3's switch for answering without reasoning: an empty think block.
            out.append(("<think>\n\n</think>\n\n", Provenance.TEMPLATE, True))
        return render_pieces(self.tok, out)

    @staticmethod
    def opens_thinking(thinking: bool) -> bool:
        return False  # the model writes <think> itself

    def render_output(self, message: Message) -> Rendered:
        """What the model emits for an assistant message: its body and ``<|im_end|>``."""
        out: list[Piece] = []
        self._assistant_body(out, message, Provenance.SAMPLED)
        out.append(("<|im_end|>", Provenance.SAMPLED, True))
        return render_pieces(self.tok, out)


def tool_definition(tool: ToolSpec) -> dict[str, Any]:
    """A tool as the OpenAI-style definition chat templates are given; an empty description is
    left out."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = json.loads(tool.input_schema_json)
    return {"type": "function", "function": function}
