"""Full token sequences of recent records, bounded in bytes, and their rebuild from the log.

An engine call needs the whole input: the stored prefix a request extends plus its new
tokens. The pipeline keeps the full sequence (input + output) of each execution's latest
records so the next turn can slice its prefix from memory. At the paper's scale these are
large (a 100K-token history is 400 KB of int32 per sequence, and consecutive records of an
execution each hold their own copy), so the cache is bounded twice: at most ``per_execution``
sequences for one execution, and at most ``max_bytes`` for all of them together, the least
recently used going first. A sequence not held is rebuilt from the execution's stored records.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


class SequenceCache:
    """Recently used full sequences, keyed by (execution, record); bounded in count and bytes."""

    def __init__(self, *, max_bytes: int, per_execution: int) -> None:
        if max_bytes < 0 or per_execution < 1:
            raise ValueError("a sequence cache needs max_bytes >= 0 and per_execution >= 1")
        self.max_bytes = max_bytes
        self.per_execution = per_execution
        self._lru: OrderedDict[tuple[str, str], npt.NDArray[np.int32]] = OrderedDict()
        self._by_execution: dict[str, OrderedDict[str, None]] = {}
        self._bytes = 0
        self.evicted_for_bytes = 0  # sequences dropped to stay under max_bytes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._lru)

    def holds(self, execution_id: str, request_id: str) -> bool:
        return (execution_id, request_id) in self._lru

    def executions(self) -> int:
        return len(self._by_execution)

    def get(self, execution_id: str, request_id: str) -> npt.NDArray[np.int32] | None:
        """The sequence, marked as just used; None when it is not held."""
        key = (execution_id, request_id)
        seq = self._lru.get(key)
        if seq is not None:
            self._lru.move_to_end(key)
            self._by_execution[execution_id].move_to_end(request_id)
        return seq

    def put(self, execution_id: str, request_id: str, sequence: npt.NDArray[np.int32]) -> None:
        """Hold ``sequence``; the oldest of its execution past ``per_execution`` go, then the
        least recently used of all until the total fits ``max_bytes`` (the newest one stays,
        whatever its size, until the next put)."""
        key = (execution_id, request_id)
        self._drop(key)
        self._lru[key] = sequence
        self._bytes += int(sequence.nbytes)
        mine = self._by_execution.setdefault(execution_id, OrderedDict())
        mine[request_id] = None
        while len(mine) > self.per_execution:
            self._drop((execution_id, next(iter(mine))))
        while self._bytes > self.max_bytes and len(self._lru) > 1:
            self._drop(next(iter(self._lru)))
            self.evicted_for_bytes += 1

    def forget(self, execution_id: str) -> None:
        """Drop every sequence of ``execution_id``."""
        for request_id in list(self._by_execution.get(execution_id, ())):
            self._drop((execution_id, request_id))

    def _drop(self, key: tuple[str, str]) -> None:
        seq = self._lru.pop(key, None)
        if seq is None:
            return
        self._bytes -= int(seq.nbytes)
        execution_id, request_id = key
        mine = self._by_execution[execution_id]
        del mine[request_id]
        if not mine:
            del self._by_execution[execution_id]


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """What one stored record adds to its execution: the part of its sequence not shared."""

    request_id: str
    prefix_of: str | None
    prefix_len: int
    new_tokens: npt.NDArray[np.int32]  # its new input tokens, then its output


def rebuild_sequence(records: Iterable[StoredRecord], request_id: str) -> npt.NDArray[np.int32] | None:
    """The full sequence of ``request_id``, assembled from its ancestors' new tokens.

    Holds each record's new tokens once (not every record's full sequence) and copies the
    result once: O(unique tokens + the sequence's length), where building every record's
    full sequence in turn is O(records x history). None when the record is not among them.
    """
    by_id = {r.request_id: r for r in records}
    rec = by_id.get(request_id)
    if rec is None:
        return None
    pieces: list[npt.NDArray[np.int32]] = []
    need = rec.prefix_len + int(rec.new_tokens.shape[0])  # tokens of ``rec``'s sequence still wanted
    while True:
        own = need - rec.prefix_len  # how many of them are ``rec``'s own new tokens
        if own > 0:
            pieces.append(rec.new_tokens[:own])
            need = rec.prefix_len
        if need == 0:
            break
        if rec.prefix_of is None or rec.prefix_of not in by_id:
            raise ValueError(
                f"record {rec.request_id} shares {rec.prefix_len} tokens with "
                f"{rec.prefix_of!r}, which is not stored"
            )
        rec = by_id[rec.prefix_of]
    if not pieces:
        return np.zeros(0, np.int32)
    return np.concatenate(pieces[::-1]).astype(np.int32, copy=False)
