"""Message-chain hashes kept per execution, so a request hashes only the messages it adds.

A harness resends its whole history on every call. Hashing it from scratch (canonical bytes
of every message, one blake2b per message) is O(history) per request, which made it the
largest part of ingest. ``ChainCache`` keeps the last few message chains of each execution
with their running hashes; a request's messages are compared with them as objects (a memory
compare, no serialization) and only the messages after the longest equal prefix are hashed,
continuing from the stored hash there. Equal messages have equal canonical bytes, so the
result is always exactly ``chain_hashes`` of the whole chain: the cache never changes what
is matched, only what it costs. It holds no tokens and reads nothing from the log.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from gyre_proxy.chat import Message, chain_hashes, system_sha


@dataclass(frozen=True, slots=True)
class _Chain:
    messages: tuple[Message, ...]
    hashes: tuple[bytes, ...]
    system_sha: str


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
    branch a compaction started); ``executions`` bounds the executions kept, least recently
    used first out. A forgotten chain costs one full hash on its next request, nothing else.
    """

    def __init__(self, *, executions: int = 4096, chains: int = 8) -> None:
        if executions < 1 or chains < 1:
            raise ValueError("a chain cache keeps at least one execution and one chain each")
        self._max_executions = executions
        self._max_chains = chains
        self._by_execution: OrderedDict[str, list[_Chain]] = OrderedDict()
        self._lock = threading.Lock()
        self.hashed = 0  # messages serialized and hashed (the rest came from the cache)
        self.reused = 0  # message hashes taken from a stored chain

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
        with self._lock:
            self.hashed += len(chain) - shared
            self.reused += shared
            kept = self._by_execution.pop(execution_id, [])
            if best is not None and shared == len(chain):  # a stored chain holds this one
                kept = [best, *(c for c in kept if c is not best)]
            else:  # a chain this one extends is superseded by it; any other is a branch kept
                fresh = _Chain(chain, hashes, sha)
                kept = [fresh, *(c for c in kept if not _extends(fresh, c))]
            self._by_execution[execution_id] = kept[: self._max_chains]
            while len(self._by_execution) > self._max_executions:
                self._by_execution.popitem(last=False)
        return hashes, sha

    def forget(self, execution_id: str) -> None:
        with self._lock:
            self._by_execution.pop(execution_id, None)


def _extends(longer: _Chain, shorter: _Chain) -> bool:
    """Whether ``shorter``'s messages are a prefix of ``longer``'s (by their hashes)."""
    n = len(shorter.hashes)
    return n <= len(longer.hashes) and longer.hashes[n - 1] == shorter.hashes[-1]
