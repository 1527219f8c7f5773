"""Where the reference engine keeps KV caches outside its running requests.

``PinnedCaches`` is the source's side of a migration: caches of requests aborted with
``/gyre/kv/pin_abort``, kept until the caller releases them (the destination has taken over),
never evicted, so past the bound a new pin is refused and the request keeps decoding.
``PrefixCache`` is the destination's side: imported caches, matched by token-id prefix against
new requests; it is a cache, so past its bound the least recently used entries make room (and
weight updates or ``/flush_cache`` empty it). ``ExposedPayloads`` is the source's side of a
migration over Mooncake: the payloads of pinned caches, registered for destinations to read,
each freed with its pin. All three are thread-safe: HTTP handlers and the decode thread share
them.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gyre_proxy.engines.refengine.kvcache import KvEntry
from gyre_proxy.exceptions import KvStoreFull, PinNotFound


@dataclass(frozen=True)
class KvLimits:
    """A bound on kept caches: at most ``max_entries`` of them, ``max_bytes`` together."""

    max_entries: int = 16
    max_bytes: int = 1 << 30


class PinnedCaches:
    """Caches pinned for export, by rid; refused past ``limits``, freed only by ``release``."""

    def __init__(self, limits: KvLimits) -> None:
        self.limits = limits
        self._entries: dict[str, KvEntry] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def totals(self) -> tuple[int, int]:
        """How many entries are pinned, and their bytes."""
        with self._lock:
            return len(self._entries), self._bytes

    def add(self, entry: KvEntry) -> None:
        """Pin ``entry`` under its rid (replacing an older pin of that rid); ``KvStoreFull``
        when the bound would be passed, and then nothing changes."""
        with self._lock:
            old = self._entries.get(entry.rid)
            entries = len(self._entries) + (old is None)
            total = self._bytes - (old.nbytes if old is not None else 0) + entry.nbytes
            if entries > self.limits.max_entries or total > self.limits.max_bytes:
                raise KvStoreFull(
                    f"pinning {entry.rid} ({entry.nbytes} bytes) would keep {entries} caches, "
                    f"{total} bytes; the bound is {self.limits.max_entries} caches, "
                    f"{self.limits.max_bytes} bytes: release pinned caches, or abort it plainly"
                )
            self._entries[entry.rid] = entry
            self._bytes = total

    def get(self, rid: str) -> KvEntry:
        with self._lock:
            entry = self._entries.get(rid)
        if entry is None:
            raise PinNotFound(f"no pinned KV cache for request {rid!r} (never pinned, or released)")
        return entry

    def release(self, rid: str) -> KvEntry:
        """Unpin and return ``rid``'s entry; ``PinNotFound`` if there is none."""
        with self._lock:
            entry = self._entries.pop(rid, None)
            if entry is not None:
                self._bytes -= entry.nbytes
        if entry is None:
            raise PinNotFound(f"no pinned KV cache for request {rid!r} (never pinned, or released)")
        return entry


class PrefixCache:
    """Imported caches by key; ``match`` finds the longest shared prefix of a new request."""

    def __init__(self, limits: KvLimits) -> None:
        self.limits = limits
        self._entries: collections.OrderedDict[str, KvEntry] = collections.OrderedDict()  # LRU first
        self._bytes = 0
        self._lock = threading.Lock()

    def totals(self) -> tuple[int, int]:
        with self._lock:
            return len(self._entries), self._bytes

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._entries)

    def put(self, key: str, entry: KvEntry) -> None:
        """Keep ``entry`` under ``key`` (replacing one of that key), evicting the least recently
        used entries to fit; ``KvStoreFull`` when ``entry`` alone exceeds the byte bound."""
        if entry.nbytes > self.limits.max_bytes or self.limits.max_entries < 1:
            raise KvStoreFull(
                f"the payload ({entry.nbytes} bytes) exceeds the import bound of "
                f"{self.limits.max_entries} caches, {self.limits.max_bytes} bytes"
            )
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            while self._entries and (
                len(self._entries) >= self.limits.max_entries
                or self._bytes + entry.nbytes > self.limits.max_bytes
            ):
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
            self._entries[key] = entry
            self._bytes += entry.nbytes

    def match(self, input_ids: Sequence[int], weight_version: str) -> tuple[KvEntry, int] | None:
        """The entry sharing the longest prefix with ``input_ids`` and how many of its positions
        to reuse, or None when none shares a position (or was computed under other weights).

        At most ``len(input_ids) - 1`` positions are reused: the next token's logits need the
        last position's hidden state, which a KV cache does not hold, so that token is always
        run (SGLang's prefix cache does the same).
        """
        limit = len(input_ids) - 1
        if limit < 1:
            return None
        ids = np.asarray(input_ids, dtype=np.int32)
        best: tuple[str, KvEntry, int] | None = None
        with self._lock:
            for key, entry in self._entries.items():
                if entry.weight_version != weight_version:
                    continue
                n = min(entry.num_tokens, limit)
                same = entry.token_ids[:n] == ids[:n]
                shared = n if bool(same.all()) else int(np.argmin(same))  # the first mismatch
                if shared > 0 and (best is None or shared > best[2]):
                    best = (key, entry, shared)
            if best is None:
                return None
            self._entries.move_to_end(best[0])
        return best[1], best[2]

    def clear(self) -> int:
        """Drop every entry; returns how many there were."""
        with self._lock:
            count = len(self._entries)
            self._entries.clear()
            self._bytes = 0
        return count


@dataclass(frozen=True, eq=False)
class Exposure:
    """The payload of a pinned ``entry``, registered at ``address`` in this engine's ``segment``."""

    entry: KvEntry
    data: bytes  # what /gyre/kv/export would answer; kept alive while registered
    segment: str
    address: int


class ExposedPayloads:
    """Exposures by rid; bounded by the pins they belong to (one each, released with them)."""

    def __init__(self) -> None:
        self._entries: dict[str, Exposure] = {}
        self._lock = threading.Lock()

    def totals(self) -> tuple[int, int]:
        """How many payloads are exposed, and their bytes."""
        with self._lock:
            return len(self._entries), sum(len(e.data) for e in self._entries.values())

    def get(self, rid: str) -> Exposure | None:
        with self._lock:
            return self._entries.get(rid)

    def put(self, rid: str, exposure: Exposure) -> Exposure | None:
        """Keep ``exposure`` under ``rid``; returns the one it replaced (to withdraw), if any."""
        with self._lock:
            old = self._entries.get(rid)
            self._entries[rid] = exposure
        return old

    def pop(self, rid: str) -> Exposure | None:
        with self._lock:
            return self._entries.pop(rid, None)

    def pop_all(self) -> list[Exposure]:
        with self._lock:
            found = list(self._entries.values())
            self._entries.clear()
        return found
