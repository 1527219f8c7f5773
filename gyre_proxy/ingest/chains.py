"""Message-chain hashes kept per execution, so a request hashes only the messages it adds.

A harness resends its whole history on every call. Hashing it from scratch (canonical bytes
of every message, one blake2b per message) is O(history) per request, which made it the
largest part of ingest. ``ChainCache`` keeps the last few message chains of each execution
with their running hashes; a request's messages are compared with them as objects (a memory
compare, no serialization) and only the messages after the longest equal prefix are hashed,
continuing from the stored hash there. Equal messages have equal canonical bytes, so the
result is always exactly ``chain_hashes`` of the whole chain: the cache never changes what
is matched, only what it costs. It holds no tokens and reads nothing from the log, but it
holds each kept chain's messages, a whole history's text: at 100K tokens about half a
megabyte per chain, so it is bounded in characters as well as in executions and chains.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from gyre_proxy.chat import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    chain_hashes,
    system_sha,
)


def text_size(message: Message) -> int:
    """Characters of text ``message`` carries (its blocks' text, thinking, tool inputs)."""
    n = 0
    for b in message.blocks:
        if isinstance(b, TextBlock):
            n += len(b.text)
        elif isinstance(b, ThinkingBlock):
            n += len(b.thinking)
        elif isinstance(b, ToolUseBlock):
            n += len(b.name) + len(b.input_json)
        else:
            n += len(b.content)
    return n


@dataclass(frozen=True, slots=True)
class _Chain:
    messages: tuple[Message, ...]
    hashes: tuple[bytes, ...]
    system_sha: str
    chars: int  # text_size of its messages together


def _shared(stored: tuple[Message, ...], messages: tuple[Message, ...]) -> int:
    """How many leading messages the two chains have equal."""
    n = min(len(stored), len(messages))
    if stored[:n] == messages[:n]:  # the common case: the request extends a stored chain
        return n
    for i in range(n):
        if stored[i] != messages[i]:
            return i
    return n  # pragma: no cover - the slices differed, so some message did


class ChainCache:
    """Per execution, its recent message chains and their running hashes; thread-safe.

    ``chains`` bounds the chains kept per execution (a main agent, its sub-agents, the
    branch a compaction started); ``executions`` bounds the executions kept, and
    ``max_chars`` the text of all kept chains together; past either, the least recently used
    executions go first (the one just used stays, whatever its size). A forgotten chain costs
    one full hash on its next request, nothing else.
    """

    def __init__(self, *, executions: int = 4096, chains: int = 8, max_chars: int = 1 << 30) -> None:
        if executions < 1 or chains < 1 or max_chars < 0:
            raise ValueError(
                "a chain cache keeps at least one execution and one chain each, and max_chars >= 0"
            )
        self._max_executions = executions
        self._max_chains = chains
        self._max_chars = max_chars
        self._by_execution: OrderedDict[str, list[_Chain]] = OrderedDict()
        self._chars = 0  # text of every kept chain
        self._lock = threading.Lock()
        self.hashed = 0  # messages serialized and hashed (the rest came from the cache)
        self.reused = 0  # message hashes taken from a stored chain
        self.evicted_for_chars = 0  # executions dropped to stay under max_chars

    @property
    def chars(self) -> int:
        """Characters of text the kept chains hold together."""
        return self._chars

    def hashes(self, execution_id: str, messages: Sequence[Message]) -> tuple[tuple[bytes, ...], str]:
        """``(chain_hashes(messages), system_sha(messages[0]))`` for a non-empty chain, hashing
        only the messages after the longest stored prefix; the chain is kept for the next call."""
        chain = tuple(messages)
        if not chain:
            raise ValueError("a message chain starts with its system message; this one is empty")
        with self._lock:
            stored = list(self._by_execution.get(execution_id, ()))
        best: _Chain | None = None
        shared = 0
        for candidate in stored:
            n = _shared(candidate.messages, chain)
            if n > shared:
                best, shared = candidate, n
                if n == len(chain):
                    break
        if best is None:
            hashes = tuple(chain_hashes(chain))
            sha = system_sha(chain[0])
        else:
            rest = chain_hashes(chain[shared:], after=best.hashes[shared - 1])
            hashes = best.hashes[:shared] + tuple(rest)
            sha = best.system_sha
        fresh = None
        if best is None or shared < len(chain):
            if best is not None and shared == len(best.messages):  # the common case: it extends best
                chars = best.chars + sum(text_size(m) for m in chain[shared:])
            else:
                chars = sum(text_size(m) for m in chain)
            fresh = _Chain(chain, hashes, sha, chars)
        with self._lock:
            self.hashed += len(chain) - shared
            self.reused += shared
            kept = self._pop(execution_id)
            if fresh is None:  # a stored chain holds this one
                assert best is not None
                kept = [best, *(c for c in kept if c is not best)]
            else:  # a chain this one extends is superseded by it; any other is a branch kept
                kept = [fresh, *(c for c in kept if not _extends(fresh, c))]
            kept = kept[: self._max_chains]
            self._by_execution[execution_id] = kept
            self._chars += sum(c.chars for c in kept)
            while len(self._by_execution) > self._max_executions:
                self._pop(next(iter(self._by_execution)))
            while self._chars > self._max_chars and len(self._by_execution) > 1:
                self._pop(next(iter(self._by_execution)))
                self.evicted_for_chars += 1
        return hashes, sha

    def forget(self, execution_id: str) -> None:
        with self._lock:
            self._pop(execution_id)

    def _pop(self, execution_id: str) -> list[_Chain]:
        """Remove an execution's chains (the lock held) and return them."""
        kept = self._by_execution.pop(execution_id, [])
        self._chars -= sum(c.chars for c in kept)
        return kept


def _extends(longer: _Chain, shorter: _Chain) -> bool:
    """Whether ``shorter``'s messages are a prefix of ``longer``'s (by their hashes)."""
    n = len(shorter.hashes)
    return n <= len(longer.hashes) and longer.hashes[n - 1] == shorter.hashes[-1]
