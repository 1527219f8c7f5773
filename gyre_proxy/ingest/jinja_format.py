"""A checkpoint's own chat template (Jinja), rendered one message at a time.

The template is run as Hugging Face's ``apply_chat_template`` runs it (a sandboxed Jinja
environment with ``trim_blocks`` and ``lstrip_blocks``, the ``tojson`` filter, a
``raise_exception`` global, the special tokens as variables), on the conversation in the
OpenAI shape that chat templates take: ``tools`` as function definitions, assistant
``reasoning_content`` and ``tool_calls`` (``arguments`` as a JSON object, as OpenAI-compatible
servers give templates),
tool results as ``tool`` messages.

Only new messages are rendered, each in a window: the system message, the first message (where
some templates put the tools), the message before it, and the message after it (a template may
write the last message differently). Message ``j``'s text is what the template writes after the
window ``[system, m_1, m_{j-1}]`` once ``m_j`` is added. A message's text ends with its last end token (``<|im_end|>``,
``<|eot_id|>``); what a template writes after that (Qwen's newline) opens the next message, so
a sampled answer, which ends with its end token, is a message boundary and is never
re-rendered. A template may write the turn before the new message differently once the new
one follows (Qwen3 drops the reasoning of assistant turns before the last user query, and writes
an empty think block only in the last assistant turn): the stored tokens of that turn stay as
they were sampled or first rendered. A template whose earlier output changes in any other way
raises ``TemplateNotIncremental`` naming the message. The rendered text is encoded with
``encode_pieces``: the template's markup that is an added token is one id, text from the
harness stays text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gyre_proxy.chat import (
    ChatRequest,
    Message,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gyre_proxy.engines import Tokenizer, special_pattern
from gyre_proxy.exceptions import ChatFormatError, TemplateNotIncremental
from gyre_proxy.ingest.chat_template import Rendered, render_pieces, tool_definition
from gyre_store.catalog import Provenance

OpenAIMessage = dict[str, Any]
PLACEHOLDER = "\ue000"  # stands in for each character of an added token a harness spelled


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled the way ``apply_chat_template`` compiles a chat template."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def openai_messages(message: Message) -> list[OpenAIMessage]:
    """One of gyre's messages as the OpenAI-shaped messages a chat template takes.

    A user message's tool results become ``tool`` messages and its words a ``user`` message,
    in their order; an assistant message keeps its reasoning, text and tool calls.
    """
    if message.role == Role.ASSISTANT:
        content = "".join(b.text for b in message.blocks if isinstance(b, TextBlock))
        out: OpenAIMessage = {"role": "assistant", "content": content}
        thinking = [b.thinking for b in message.blocks if isinstance(b, ThinkingBlock)]
        if thinking:
            out["reasoning_content"] = "\n".join(thinking)
        calls = [b for b in message.blocks if isinstance(b, ToolUseBlock)]
        if calls:
            out["tool_calls"] = [
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": _arguments(b.input_json)},
                }
                for b in calls
            ]
        return [out]
    if message.role == Role.SYSTEM:
        return [{"role": "system", "content": message.text()}]
    result: list[OpenAIMessage] = []
    words: list[str] = []
    for b in message.blocks:
        if isinstance(b, ToolResultBlock):
            if words:
                result.append({"role": "user", "content": "\n".join(words)})
                words = []
            result.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.content})
        elif isinstance(b, TextBlock):
            words.append(b.text)
    if words or not result:
        result.append({"role": "user", "content": "\n".join(words)})
    return result


def _arguments(raw: str) -> Any:
    """A tool call's arguments as templates take them: the JSON object (templates write it with
    ``tojson`` or walk its items), or the text as sent when it is not one."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, dict) else raw


def _message_provenance(message: Message) -> Provenance:
    if message.role == Role.ASSISTANT:
        return Provenance.INJECTED_ASSISTANT
    if message.role == Role.SYSTEM:
        return Provenance.SYSTEM
    results = [b for b in message.blocks if isinstance(b, ToolResultBlock)]
    if results and all(b.critique for b in results):
        return Provenance.CRITIQUE
    if results:
        return Provenance.TOOL_RESULT
    if any(isinstance(b, TextBlock) and b.critique for b in message.blocks):
        return Provenance.CRITIQUE
    return Provenance.USER


def _harness_strings(value: Any) -> list[str]:
    """Every string a harness supplied in ``value`` (messages or tools: what must stay text)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                if k not in ("role", "type"):
                    walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    walk(value)
    return found


def _placeholder(match: re.Match[str]) -> str:
    return PLACEHOLDER * len(match.group())


class JinjaChatFormat:
    """A ``ChatFormat`` running a checkpoint's Jinja chat template (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        source: str,
        *,
        family: str,
        stop_ids: Sequence[int],
        end_tokens: Sequence[str],
        variables: Mapping[str, Any] | None = None,
        name: str = "chat template",
    ) -> None:
        self.tok = tokenizer
        self.family = family
        self.name = name
        self.source = source
        self._template = compile_template(source)
        self._variables = dict(variables or {})
        missing = [t for t in end_tokens if t not in tokenizer.specials]
        if missing or not end_tokens:
            raise ChatFormatError(
                f"{name}: the end tokens {list(end_tokens)} are not all added tokens of the vocabulary"
            )
        self._end_texts = tuple(end_tokens)
        self.end_ids = frozenset(tokenizer.special(t) for t in end_tokens)
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys([*stop_ids, *sorted(self.end_ids)]))
        self._markup = special_pattern(tokenizer)  # any added token, to find one a harness spelled
        self._special_ids = frozenset(tokenizer.specials.values())
        self._opens: dict[bool, bool] = {}

    # -- rendering text ------------------------------------------------------------------------

    def render_text(
        self,
        messages: Sequence[OpenAIMessage],
        tools: Sequence[dict[str, Any]] = (),
        *,
        add_generation_prompt: bool = False,
        thinking: bool = True,
    ) -> str:
        """The template's text for a whole conversation (what ``apply_chat_template`` writes)."""
        try:
            return self._template.render(
                messages=list(messages),
                tools=list(tools) or None,
                add_generation_prompt=add_generation_prompt,
                enable_thinking=thinking,
                **self._variables,
            )
        except jinja2.TemplateError as exc:
            raise ChatFormatError(f"{self.name} cannot render this conversation: {exc}") from exc

    # -- ChatFormat ----------------------------------------------------------------------------

    def _context(self, request: ChatRequest, messages: tuple[Message, ...], j: int) -> list[OpenAIMessage]:
        """The window rendered before message ``j``: the system message, the first message (where
        some templates put the tools) and message ``j - 1``."""
        window: list[OpenAIMessage] = []
        if request.system:
            window.append({"role": "system", "content": request.system})
        if j >= 3:
            window.extend(openai_messages(messages[1]))
        if j >= 2:
            window.extend(openai_messages(messages[j - 1]))
        return window

    def _ends(self, text: str, start: int = 0) -> list[int]:
        """The positions just after each end token in ``text[start:]``, in order."""
        found: list[int] = []
        for token in self._end_texts:
            position = text.find(token, start)
            while position >= 0:
                found.append(position + len(token))
                position = text.find(token, position + len(token))
        return sorted(found)

    def _delta(
        self, before: list[OpenAIMessage], added: list[OpenAIMessage], after: list[OpenAIMessage],
        tools: list[dict[str, Any]], thinking: bool, *, generation: bool, where: str,
    ) -> str:  # fmt: skip
        """The text the template writes for ``added`` (or the generation prompt) after ``before``,
        with ``after`` following it (a template may write a message differently when it is last).

        The new text starts after the end token of ``before``'s last turn, and runs through the
        end token of ``added``'s last turn. ``before``'s last turn may be written differently once
        more follows (a stored, sampled turn is kept as it was); anything earlier may not."""
        if not before:
            if generation and not added:
                return self.render_text([], tools, add_generation_prompt=True, thinking=thinking)
            head, marks = "", []
        else:
            head = self.render_text(before, tools, thinking=thinking)
            marks = self._ends(head)
            if not marks:
                raise TemplateNotIncremental(
                    f"{self.name} ends no turn with {list(self._end_texts)} before {where}"
                )
        if generation:
            full = self.render_text([*before, *added], tools, add_generation_prompt=True, thinking=thinking)
            turns = 0
        else:
            alone = self.render_text([*before, *added], tools, thinking=thinking)
            turns = len(self._ends(alone)) - len(marks)
            full = self.render_text([*before, *added, *after], tools, thinking=thinking) if after else alone
        found = self._ends(full)
        kept = marks[-2] if len(marks) >= 2 else 0  # everything before the last turn of ``before``
        if full[:kept] != head[:kept] or len(found) < len(marks) + turns or (not generation and turns < 1):
            raise TemplateNotIncremental(
                f"{self.name} writes the messages before {where} differently once it is added, in a way "
                "token-in/token-out recording cannot follow (only the last turn before it may change)"
            )
        start = found[len(marks) - 1] if marks else 0
        return full[start:] if generation else full[start : found[len(marks) + turns - 1]]

    def _neutral_value(self, value: Any) -> Any:
        """``value`` with every added token a harness string spells replaced by a placeholder
        of the same length."""
        if isinstance(value, str):
            return value if self._markup is None else self._markup.sub(_placeholder, value)
        if isinstance(value, Mapping):
            return {k: v if k in ("role", "type") else self._neutral_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._neutral_value(v) for v in value]
        return value

    def _spells_markup(self, *values: Any) -> bool:
        markup = self._markup
        return markup is not None and any(markup.search(s) for s in _harness_strings(values))

    def _part(
        self, before: list[OpenAIMessage], added: list[OpenAIMessage], after: list[OpenAIMessage],
        tools: list[dict[str, Any]], thinking: bool, *, generation: bool, where: str, prov: Provenance,
    ) -> Rendered:  # fmt: skip
        """The new text for ``added`` (or the generation prompt), encoded: the template's added
        tokens as ids, the harness's strings as text.

        Where a harness string spells an added token, the same conversation is rendered again
        with those spelled in placeholders of the same length: an added token in the first
        text where the second has placeholders came from the harness and stays text."""
        text = self._delta(before, added, after, tools, thinking, generation=generation, where=where)
        if not self._spells_markup(before, added, after, tools):
            return self._pieces([(text, True)], prov)
        neutral = self._delta(
            self._neutral_value(before), self._neutral_value(added), self._neutral_value(after),
            self._neutral_value(tools), thinking,
            generation=generation, where=where,
        )  # fmt: skip
        if len(neutral) != len(text):
            raise ChatFormatError(
                f"{self.name} interprets markup that a harness wrote in {where}: "
                "its text cannot be told from the template's own"
            )
        pieces: list[tuple[str, bool]] = []
        position = index = 0
        while index < len(text):
            if neutral[index] == PLACEHOLDER and text[index] != PLACEHOLDER:
                stop = index
                while stop < len(text) and neutral[stop] == PLACEHOLDER and text[stop] != PLACEHOLDER:
                    stop += 1
                pieces += [(text[position:index], True), (text[index:stop], False)]
                position = index = stop
            else:
                index += 1
        pieces.append((text[position:], True))
        return self._pieces(pieces, prov)

    def render_new(
        self, request: ChatRequest, messages: tuple[Message, ...], start: int
    ) -> tuple[list[Rendered], Rendered]:
        tools = [tool_definition(t) for t in request.tools]
        thinking = request.thinking
        parts: list[Rendered] = []
        system = [{"role": "system", "content": request.system}] if request.system else []
        alone = False  # the system turn rendered (and indexed) on its own
        for j in range(start, len(messages)):
            if j == 0:
                # The system turn alone, with the tools, where the template can write it so; else
                # (no system prompt, or tools that go in the first user message) it is rendered
                # with the first message.
                try:
                    part = self._part([], system, [], tools, thinking, generation=False,
                                      where="the system message", prov=Provenance.SYSTEM) if system else Rendered()  # fmt: skip
                except ChatFormatError:
                    part = Rendered()
                alone = len(part) > 0
                parts.append(part)
                continue
            together = j == 1 and start == 0 and not alone and bool(system)
            parts.append(self._part(
                [] if together else self._context(request, messages, j),
                [*system, *openai_messages(messages[j])] if together else openai_messages(messages[j]),
                openai_messages(messages[j + 1]) if j + 1 < len(messages) else [], tools, thinking,
                generation=False, where=f"message {j}", prov=_message_provenance(messages[j]),
            ))  # fmt: skip
        gen = self._part(self._context(request, messages, len(messages)), [], [], tools, thinking,
                         generation=True, where="the generation prompt", prov=Provenance.TEMPLATE)  # fmt: skip
        return parts, gen

    def _pieces(self, pieces: list[tuple[str, bool]], prov: Provenance) -> Rendered:
        out = render_pieces(self.tok, [(t, prov, markup) for t, markup in pieces])
        specials = self._special_ids
        out.prov = [
            int(Provenance.TEMPLATE) if i in specials else p for i, p in zip(out.ids, out.prov, strict=True)
        ]
        return out

    def opens_thinking(self, thinking: bool) -> bool:
        if thinking not in self._opens:
            user: list[OpenAIMessage] = [{"role": "user", "content": "-"}]
            prompt = self.render_text(user, add_generation_prompt=True, thinking=thinking)
            self._opens[thinking] = prompt.rstrip().endswith("<think>")
        return self._opens[thinking]

    def render_output(self, message: Message) -> Rendered:
        """The assistant message as the model would emit it: the text the template writes for
        it after the generation prompt, through its end token."""
        user: list[OpenAIMessage] = [{"role": "user", "content": "-"}]
        prompt = self.render_text(user, add_generation_prompt=True)
        full = self.render_text([*user, *openai_messages(message)])
        if not full.startswith(prompt):
            raise TemplateNotIncremental(
                f"{self.name} writes an assistant turn that does not extend its generation prompt"
            )
        ends = self._ends(full, len(prompt))
        if not ends:
            raise TemplateNotIncremental(f"{self.name} ends no assistant turn with {list(self._end_texts)}")
        text = full[len(prompt) : ends[0]]
        out = render_pieces(self.tok, [(text, Provenance.SAMPLED, True)])
        return out
