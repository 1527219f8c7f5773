"""The harness-neutral chat model the proxy works on.

Anthropic Messages and OpenAI Chat Completions requests are both translated into a
``ChatRequest`` of ``Message``s made of typed blocks; responses go back out from a
``ChatResponse``. Canonical serialization (for prefix matching) lives here too: it is
what makes a history the harness re-serialized still match the stored one.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Iterable, Sequence

import msgspec


class Role(enum.StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class TextBlock(msgspec.Struct, frozen=True, tag="text"):
    text: str
    critique: bool = False  # evaluator feedback rather than the user's words


class ThinkingBlock(msgspec.Struct, frozen=True, tag="thinking"):
    thinking: str
    signature: str = ""


class ToolUseBlock(msgspec.Struct, frozen=True, tag="tool_use"):
    id: str
    name: str
    input_json: str  # the raw JSON arguments, as generated (restored from the payload cache)


class ToolResultBlock(msgspec.Struct, frozen=True, tag="tool_result"):
    tool_use_id: str
    content: str
    is_error: bool = False
    critique: bool = False  # the content is an evaluator's critique the execution asked for


Block = TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock


class Message(msgspec.Struct, frozen=True):
    role: Role
    blocks: tuple[Block, ...]

    def text(self) -> str:
        return "".join(b.text for b in self.blocks if isinstance(b, TextBlock))


class ToolSpec(msgspec.Struct, frozen=True):
    name: str
    description: str = ""
    input_schema_json: str = "{}"


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A model call as the policy sees it, whatever API it arrived through."""

    system: str = ""
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    thinking: bool = False
    model: str = ""
    # What the client says about the call beyond the prompt (Codex's thread and agent, from
    # ``client_metadata``): read by harness plug-ins to classify it, never rendered.
    client_metadata: tuple[tuple[str, str], ...] = ()


class StopReason(enum.StrEnum):
    END_TURN = "end_turn"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"


class ChatResponse(msgspec.Struct, frozen=True, kw_only=True):
    blocks: tuple[Block, ...]
    stop_reason: StopReason
    input_tokens: int
    output_tokens: int
    stop_sequence: str | None = None


# -- canonical serialization and the message-chain hash ------------------------------------

_encoder = msgspec.json.Encoder(order="sorted")


@functools.lru_cache(maxsize=8192)
def _canonical_json(raw: str) -> str:
    """JSON text in one canonical form (sorted keys, no spaces); unparsable text as is.

    Cached: a history sends the same tool inputs back on every request."""
    try:
        return _encoder.encode(msgspec.json.decode(raw)).decode()
    except msgspec.DecodeError:
        return raw


def canonical(message: Message) -> bytes:
    """The bytes two serializations of the same message agree on.

    Thinking is left out: harnesses differ in whether they send it back, and the stored
    tokens of a matched output keep it anyway. Tool inputs are compared as canonical
    JSON so reordered keys or re-spaced JSON still match.
    """
    parts: list[object] = [message.role]  # a StrEnum: encoded as its value
    for b in message.blocks:
        if isinstance(b, TextBlock):
            if b.text:
                parts.append(["t", b.text, b.critique])
        elif isinstance(b, ToolUseBlock):
            parts.append(["u", b.id, b.name, _canonical_json(b.input_json)])
        elif isinstance(b, ToolResultBlock):
            parts.append(["r", b.tool_use_id, b.content, b.is_error])
    return _encoder.encode(parts)


def system_message(system: str, tools: Sequence[ToolSpec]) -> Message:
    """The system prompt and tool definitions as the first message of the context."""
    blocks: list[Block] = [TextBlock(system)]
    if tools:
        blocks.append(
            TextBlock(
                _encoder.encode(
                    [[t.name, t.description, _canonical_json(t.input_schema_json)] for t in tools]
                ).decode()
            )
        )
    return Message(Role.SYSTEM, tuple(blocks))


def chain_hashes(messages: Iterable[Message], *, after: bytes = b"") -> list[bytes]:
    """h_i = H(h_{i-1} || canonical(m_i)), 16 bytes each: equal hashes mean equal prefixes.

    ``after`` is the hash the chain continues from (that of the messages before these).
    """
    out: list[bytes] = []
    h = after
    for m in messages:
        h = hashlib.blake2b(h + canonical(m), digest_size=16).digest()
        out.append(h)
    return out


def system_sha(message: Message) -> str:
    return hashlib.sha256(canonical(message)).hexdigest()[:16]
