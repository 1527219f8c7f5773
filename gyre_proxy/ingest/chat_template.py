"""The Qwen3 chat template (ChatML), rendered one message at a time with provenance.

Each message renders to ``[\\n] <|im_start|>role\\n content <|im_end|>``: the newline that
follows an ``<|im_end|>`` is written as the start of the next message, so every message
(and every sampled answer, which ends with ``<|im_end|>``) ends on a message boundary and
a history can be extended without re-rendering what is already stored. The text is what
Qwen3's official template writes for the same messages: tool definitions as ``json.dumps``
writes them (``", "`` and ``": "``), one newline before each ``<tool_call>``, tool results
as user turns of ``<tool_response>`` blocks, no system turn when there is neither a system
prompt nor a tool. One deliberate difference: reasoning in earlier turns is kept (the
official template drops it), because a stored history keeps the tokens as they were sampled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import msgspec

from gyre_proxy.chat import Message, Role, TextBlock, ThinkingBlock, ToolResultBlock, ToolSpec, ToolUseBlock
from gyre_proxy.engines import Tokenizer
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

    def __len__(self) -> int:
        return len(self.ids)


class Qwen3Template:
    """Renders messages, the generation prompt and (for synthetic traces) model outputs."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.im_start = tokenizer.special("<|im_start|>")
        self.im_end = tokenizer.special("<|im_end|>")
        self._nl = tokenizer.encode("\n")

    def _open(self, out: Rendered, role: str, first: bool) -> None:
        if not first:
            out.add(self._nl, Provenance.TEMPLATE)
        out.add([self.im_start], Provenance.TEMPLATE)
        out.add(self.tok.encode(f"{role}\n"), Provenance.TEMPLATE)

    def tools_text(self, tools: tuple[ToolSpec, ...]) -> str:
        """The tool section: each definition as the template's ``tojson`` writes it, which is
        ``json.dumps`` with its default separators, keys in the client's order, non-ASCII kept."""
        lines = [json.dumps(_definition(t), ensure_ascii=False) for t in tools]
        return TOOLS_PREAMBLE + "".join("\n" + line for line in lines) + TOOLS_POSTAMBLE

    @staticmethod
    def has_system(system: str, tools: tuple[ToolSpec, ...]) -> bool:
        """Whether the context opens with a system turn (the template writes none without
        a system prompt or a tool)."""
        return bool(system or tools)

    def render_system(self, system: str, tools: tuple[ToolSpec, ...]) -> Rendered:
        out = Rendered()
        if not self.has_system(system, tools):
            return out
        self._open(out, "system", first=True)
        text = system
        if tools:
            text = (system + "\n\n" if system else "") + self.tools_text(tools)
        out.add(self.tok.encode(text), Provenance.SYSTEM)
        out.add([self.im_end], Provenance.TEMPLATE)
        return out

    def render_message(self, message: Message, *, first: bool = False) -> Rendered:
        """One message of the history (the system message goes through render_system)."""
        out = Rendered()
        if message.role == Role.ASSISTANT:
            self._open(out, "assistant", first)
            self._assistant_body(out, message, Provenance.INJECTED_ASSISTANT)
        elif message.role == Role.SYSTEM:
            # A system (developer) turn later in the history, where the client put it.
            self._open(out, "system", first)
            out.add(self.tok.encode(message.text()), Provenance.SYSTEM)
        else:
            self._open(out, "user", first)
            for i, b in enumerate(message.blocks):
                if i and isinstance(b, ToolResultBlock) != isinstance(message.blocks[i - 1], ToolResultBlock):
                    # Tool results and the user's own words are separate turns in the template.
                    out.add([self.im_end], Provenance.TEMPLATE)
                    self._open(out, "user", first=False)
                elif i:
                    out.add(self._nl, Provenance.TEMPLATE)
                if isinstance(b, ToolResultBlock):
                    out.add(self.tok.encode("<tool_response>\n"), Provenance.TEMPLATE)
                    out.add(
                        self.tok.encode(b.content),
                        Provenance.CRITIQUE if b.critique else Provenance.TOOL_RESULT,
                    )
                    out.add(self.tok.encode("\n</tool_response>"), Provenance.TEMPLATE)
                elif isinstance(b, TextBlock):
                    out.add(self.tok.encode(b.text), Provenance.CRITIQUE if b.critique else Provenance.USER)
        out.add([self.im_end], Provenance.TEMPLATE)
        return out

    def _assistant_body(self, out: Rendered, message: Message, prov: Provenance) -> None:
        text = ""
        for b in message.blocks:
            if isinstance(b, ThinkingBlock):
                text += f"<think>\n{b.thinking.strip(chr(10))}\n</think>\n\n"
            elif isinstance(b, TextBlock):
                text += b.text.lstrip("\n") if text.endswith("</think>\n\n") else b.text
            elif isinstance(b, ToolUseBlock):
                call = (
                    '{"name": '
                    + msgspec.json.encode(b.name).decode()
                    + ', "arguments": '
                    + b.input_json
                    + "}"
                )
                text += ("\n" if text else "") + f"<tool_call>\n{call}\n</tool_call>"
        out.add(self.tok.encode(text), prov)

    def generation_prompt(self, *, thinking: bool) -> Rendered:
        out = Rendered()
        self._open(out, "assistant", first=False)
        if not thinking:
            # Qwen3's switch for answering without reasoning: an empty think block.
            out.add(self.tok.encode("<think>\n\n</think>\n\n"), Provenance.TEMPLATE)
        return out

    def render_output(self, message: Message) -> Rendered:
        """What the model emits for an assistant message: its body and ``<|im_end|>``."""
        out = Rendered()
        self._assistant_body(out, message, Provenance.SAMPLED)
        out.add([self.im_end], Provenance.SAMPLED)
        return out


def _definition(tool: ToolSpec) -> dict[str, object]:
    """A tool as the OpenAI-style definition the template is given; an empty description is left out."""
    function: dict[str, object] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = json.loads(tool.input_schema_json)
    return {"type": "function", "function": function}
