"""Scripted policy: force-decode known outputs and report the model's true logprobs.

Harness tests need a real model call to return a real tool call. The script is a list of
outputs (token ids, or texts tokenized with the engine's tokenizer); each request takes one,
chosen by the script's rule, and the engine feeds those tokens instead of sampling them while
still reporting the logprob the model assigns to each one. A script file is JSON::

    {"rule": "in_order" | "cycle" | "match",
     "append_eos": true,
     "outputs": ["text", [1, 2, 3], {"text": "...", "when": "substring of the prompt"}]}

``in_order`` hands entries out once each, then lets the model decode freely; ``cycle`` wraps
around; ``match`` takes the first entry whose ``when`` occurs in the decoded prompt.
"""

from __future__ import annotations

import enum
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre_proxy.engines.refengine.tokenizer import Tokenizer
from gyre_proxy.exceptions import ScriptError


class ScriptRule(enum.Enum):
    """How a request picks its scripted output."""

    IN_ORDER = "in_order"
    CYCLE = "cycle"
    MATCH = "match"


@dataclass(frozen=True)
class ScriptEntry:
    """One scripted output; ``when`` is used by the MATCH rule only."""

    token_ids: tuple[int, ...]
    when: str | None = None


class ScriptedPolicy:
    """Hands out scripted outputs to requests; safe to call from the engine's decode thread."""

    def __init__(self, entries: Sequence[ScriptEntry], rule: ScriptRule = ScriptRule.IN_ORDER) -> None:
        if not entries:
            raise ScriptError("a script needs at least one output")
        if rule is ScriptRule.MATCH and any(entry.when is None for entry in entries):
            raise ScriptError("every output of a 'match' script needs a 'when'")
        self.entries = tuple(entries)
        self.rule = rule
        self._next = 0
        self._lock = threading.Lock()

    @classmethod
    def from_json(cls, data: Any, tokenizer: Tokenizer) -> ScriptedPolicy:
        """Build from parsed script JSON; texts are tokenized with ``tokenizer``."""
        if not isinstance(data, dict) or not isinstance(data.get("outputs"), list):
            raise ScriptError("a script is a JSON object with an 'outputs' list")
        try:
            rule = ScriptRule(data.get("rule", ScriptRule.IN_ORDER.value))
        except ValueError as exc:
            raise ScriptError(f"unknown rule {data.get('rule')!r}; use in_order, cycle or match") from exc
        append_eos = bool(data.get("append_eos", True))
        entries = [_entry(item, tokenizer, append_eos) for item in data["outputs"]]
        return cls(entries, rule)

    @classmethod
    def from_file(cls, path: Path, tokenizer: Tokenizer) -> ScriptedPolicy:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ScriptError(f"cannot read script {path}: {exc}") from exc
        return cls.from_json(data, tokenizer)

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ``ScriptError`` if any scripted id is outside the model's vocabulary."""
        for index, entry in enumerate(self.entries):
            bad = [token for token in entry.token_ids if not 0 <= token < vocab_size]
            if bad:
                raise ScriptError(f"output {index} has ids {bad[:5]} outside the vocabulary of {vocab_size}")

    def next_output(self, prompt_text: str) -> tuple[int, ...] | None:
        """The tokens to force for the next request, or None to decode freely."""
        with self._lock:
            if self.rule is ScriptRule.MATCH:
                for entry in self.entries:
                    if entry.when is not None and entry.when in prompt_text:
                        return entry.token_ids
                return None
            if self.rule is ScriptRule.IN_ORDER and self._next >= len(self.entries):
                return None
            entry = self.entries[self._next % len(self.entries)]
            self._next += 1
            return entry.token_ids


def _entry(item: Any, tokenizer: Tokenizer, append_eos: bool) -> ScriptEntry:
    when: str | None = None
    if isinstance(item, dict):
        when = item.get("when")
        item = item.get("ids", item.get("text"))
    if isinstance(item, str):
        ids = tokenizer.encode(item)
        if append_eos:
            ids.append(tokenizer.eos_token_id)
    elif isinstance(item, list) and all(isinstance(token, int) for token in item):
        ids = list(item)
    else:
        raise ScriptError(f"a script output is a text or a list of token ids, not {item!r}")
    if not ids:
        raise ScriptError("a script output cannot be empty")
    return ScriptEntry(token_ids=tuple(ids), when=when)
