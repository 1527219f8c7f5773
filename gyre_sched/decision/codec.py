"""JSON round-trips for inputs, decisions and decision logs (what the event store records).

msgspec does the work: every message is a tagged frozen Struct, so a union decodes to
the right type. A log entry pairs one input with the decisions it caused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from gyre_sched.decision.decisions import Decision
from gyre_sched.decision.inputs import Input


class LogEntry(msgspec.Struct, frozen=True):
    """One input fed to the decision core and the decisions it returned, in order."""

    input: Input
    decisions: tuple[Decision, ...]


_ENCODER = msgspec.json.Encoder()
_INPUT_DECODER = msgspec.json.Decoder(Input)
_DECISION_DECODER = msgspec.json.Decoder(Decision)
_ENTRY_DECODER = msgspec.json.Decoder(LogEntry)


def encode(message: Input | Decision | LogEntry) -> bytes:
    """JSON bytes of one input, decision or log entry."""
    return _ENCODER.encode(message)


def decode_input(data: bytes | str) -> Input:
    """The input encoded in ``data``; raises msgspec.ValidationError on a malformed one."""
    return _INPUT_DECODER.decode(data)


def decode_decision(data: bytes | str) -> Decision:
    """The decision encoded in ``data``; raises msgspec.ValidationError on a malformed one."""
    return _DECISION_DECODER.decode(data)


def to_dict(message: Input | Decision | LogEntry) -> dict[str, Any]:
    """Plain JSON-ready dict (the tag under ``type``, enums as their values)."""
    built = msgspec.to_builtins(message)
    assert isinstance(built, dict)
    return built


def input_from_dict(data: dict[str, Any]) -> Input:
    """Inverse of ``to_dict`` for inputs."""
    event: Input = msgspec.convert(data, Input)
    return event


def decision_from_dict(data: dict[str, Any]) -> Decision:
    """Inverse of ``to_dict`` for decisions."""
    decision: Decision = msgspec.convert(data, Decision)
    return decision


def encode_log(entries: Iterable[LogEntry]) -> bytes:
    """JSON lines, one log entry per line."""
    return b"".join(_ENCODER.encode(entry) + b"\n" for entry in entries)


def decode_log(data: bytes) -> list[LogEntry]:
    """Inverse of ``encode_log``."""
    return [_ENTRY_DECODER.decode(line) for line in data.splitlines() if line.strip()]


def flatten(entries: Sequence[LogEntry]) -> list[Input | Decision]:
    """The log as one sequence: each input followed by its decisions."""
    out: list[Input | Decision] = []
    for entry in entries:
        out.append(entry.input)
        out.extend(entry.decisions)
    return out
