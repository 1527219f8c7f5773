"""API keys: each one writes into exactly one execution, and the log is the key store.

``issue_key`` records an ``execution.key_issued`` event holding the key's SHA-256 (the key
itself is shown once, never stored); ``StoreKeys`` resolves keys by folding those events,
re-reading the log on a miss so a key issued by another process is found, and at most
``recheck_s`` after its last read so a key revoked by another process stops working. While
the store is unavailable a known key keeps its last state (a harness in flight is not failed
by an outage it cannot see); a revocation then takes effect once the store answers again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable

from gyre_proxy.chat import ExecutionAuth
from gyre_store import StoreUnavailable
from gyre_store.catalog import ApiKeyIssued, ApiKeyRevoked
from gyre_store.log import EventLog, NewEvent

log = logging.getLogger(__name__)

KEY_TYPES = ("execution.key_issued", "execution.key_revoked")


def key_hash(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def issue_key(log: EventLog, *, execution_id: str, run_id: str, harness: str) -> str:
    """Create a key for ``execution_id``, record it, and return it (shown only this once)."""
    api_key = "gyre-" + secrets.token_urlsafe(24)
    event = ApiKeyIssued(
        key_hash=key_hash(api_key), execution_id=execution_id, run_id=run_id, harness=harness
    )
    log.append([NewEvent(event, expected_version=0)])
    return api_key


def revoke_key(log: EventLog, api_key: str, reason: str = "") -> None:
    log.append([NewEvent(ApiKeyRevoked(key_hash=key_hash(api_key), reason=reason))])


class StoreKeys:
    """A KeyResolver backed by the event log.

    A known key is answered from memory; once ``recheck_s`` has passed since the last read of
    the log, the next lookup reads the key events appended since (one small indexed read), so a
    revocation recorded anywhere takes effect within ``recheck_s``.
    """

    def __init__(
        self, log: EventLog, *, recheck_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = log
        self._keys: dict[str, ExecutionAuth | None] = {}
        self._position = 0
        self._lock = threading.Lock()
        self._recheck_s = recheck_s
        self._clock = clock
        self._read_at = float("-inf")
        self.stale_answers = 0  # known keys answered from memory while the store was unreadable

    def _stale(self) -> bool:
        return self._clock() - self._read_at > self._recheck_s

    def _refresh(self) -> None:
        with self._lock:
            self._read_at = self._clock()
            # Read up to a head taken first: every position up to it is committed, so moving the
            # cursor to it skips nothing. Taken after a read that found nothing, it could pass a
            # key issued in between, which this proxy would then refuse forever.
            head = self._log.head()
            while True:
                events = self._log.read(self._position, limit=1000, until=head, types=KEY_TYPES)
                if not events:
                    self._position = max(self._position, head)
                    return
                for ev in events:
                    if isinstance(ev.event, ApiKeyIssued):
                        e = ev.event
                        self._keys[e.key_hash] = ExecutionAuth(e.execution_id, e.run_id, e.harness)
                    elif isinstance(ev.event, ApiKeyRevoked):
                        self._keys[ev.event.key_hash] = None
                self._position = events[-1].position

    def resolve_sync(self, api_key: str) -> ExecutionAuth | None:
        """The execution ``api_key`` writes into, None for an unknown or revoked key; raises
        ``StoreUnavailable`` only for a key never seen while the store cannot be read."""
        h = key_hash(api_key)
        if h not in self._keys or self._stale():
            try:
                self._refresh()
            except StoreUnavailable as exc:
                if h not in self._keys:
                    raise
                # A recheck, not a first lookup: answering from memory keeps the execution's
                # calls (and their records, which the spool holds) going through the outage.
                # Only a revocation recorded meanwhile waits until the store answers.
                self.stale_answers += 1
                log.warning("key store unreadable (%s): answering a known key from memory", exc)
        return self._keys.get(h)

    async def resolve(self, api_key: str) -> ExecutionAuth | None:
        h = key_hash(api_key)
        if h in self._keys and not self._stale():
            return self._keys[h]
        return await asyncio.to_thread(self.resolve_sync, api_key)
