"""In-memory implementations of the store's interfaces, for unit tests and offline tools.

They follow the same contract as the PostgreSQL ones (the shared suite in
``tests/unit/store/contract.py`` runs against both) but keep nothing across processes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

import sqlalchemy as sa

from gyre_store.exceptions import ConfigError
from gyre_store.log import EventLog, Payload
from gyre_store.log.events import (
    REGISTRY,
    AppendResult,
    EventRegistry,
    Limits,
    NewEvent,
    RecordedEvent,
    StreamId,
    plan_append,
)
from gyre_store.projections import Key, Row, RowStore


class InMemoryEventLog:
    """An :class:`~gyre_store.log.interface.EventLog` held in a Python list."""

    def __init__(
        self,
        registry: EventRegistry = REGISTRY,
        limits: Limits | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """``clock`` gives each append's ``recorded_at`` (default: now, in UTC)."""
        self._clock = clock or (lambda: datetime.now(UTC))
        self._registry = registry
        self._limits = limits or Limits()
        self._events: list[RecordedEvent] = []
        self._keys: dict[str, AppendResult] = {}
        self._versions: dict[StreamId, int] = {}
        self._by_stream: dict[StreamId, list[RecordedEvent]] = {}
        self._cond = threading.Condition()

    @property
    def registry(self) -> EventRegistry:
        return self._registry

    def append(self, events: Sequence[NewEvent]) -> list[AppendResult]:
        encoded = [self._registry.encode(e, self._limits) for e in events]
        with self._cond:
            versions = dict(self._versions)
            results = plan_append(encoded, len(self._events), versions, self._keys)
            now = self._clock()
            staged = [
                RecordedEvent(
                    position=r.position,
                    stream=enc.stream,
                    stream_version=r.stream_version,
                    event_type=enc.event_type,
                    schema_version=enc.schema_version,
                    event_id=enc.new.event_id,
                    idempotency_key=enc.new.idempotency_key,
                    # Decode what was encoded, as a round trip through a database would.
                    event=self._registry.from_body(enc.event_type, enc.schema_version, enc.body),
                    payload=Payload.decode(enc.payload) if enc.payload is not None else None,
                    metadata=enc.metadata,
                    recorded_at=now,
                )
                for enc, r in zip(encoded, results, strict=True)
                if not r.duplicate
            ]
            seen = {
                enc.new.idempotency_key: r
                for enc, r in zip(encoded, results, strict=True)
                if enc.new.idempotency_key is not None and not r.duplicate
            }
            for ev in staged:
                self._events.append(ev)
                self._by_stream.setdefault(ev.stream, []).append(ev)
            self._versions = versions
            self._keys.update(seen)
            self._cond.notify_all()
            return results

    def read(
        self,
        after: int = 0,
        *,
        limit: int = 1000,
        until: int | None = None,
        types: Collection[str] | None = None,
    ) -> list[RecordedEvent]:
        with self._cond:
            end = len(self._events) if until is None else min(until, len(self._events))
            out: list[RecordedEvent] = []
            wanted = set(types) if types is not None else None
            for ev in self._events[max(after, 0) : end]:
                if wanted is None or ev.event_type in wanted:
                    out.append(ev)
                    if len(out) >= limit:
                        break
            return out

    def read_stream(self, stream: StreamId, *, after_version: int = 0) -> list[RecordedEvent]:
        with self._cond:
            return list(self._by_stream.get(stream, [])[after_version:])

    def head(self) -> int:
        with self._cond:
            return len(self._events)

    def wait(self, after: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self._events) > after, timeout=timeout)


class _MemoryRows(RowStore):
    def __init__(self, store: InMemoryProjectionStore) -> None:
        super().__init__(store.tables)
        self._store = store
        self._staged: dict[str, dict[Key, Row | None]] = {t: {} for t in store.tables}
        self._truncated: set[str] = set()
        self._checkpoints: dict[str, int] = {}

    def _load(self, table: str, key: Key) -> Row | None:
        staged = self._staged[table]
        if key in staged:
            row = staged[key]
            return None if row is None else dict(row)
        if table in self._truncated:
            return None
        found = self._store.data[table].get(key)
        return None if found is None else dict(found)

    def _write(self, upserts: Mapping[str, list[Row]], deletes: Mapping[str, list[Key]]) -> None:
        for table, keys in deletes.items():
            for key in keys:
                self._staged[table][key] = None
        for table, rows in upserts.items():
            for row in rows:
                self._staged[table][self.key_of(table, row)] = dict(row)

    def payloads(self, positions: Sequence[int]) -> dict[int, bytes]:
        return self._store.payloads(positions)

    def truncate(self, tables: Sequence[str]) -> None:
        for t in tables:
            self._truncated.add(t)
            self._staged[t].clear()
            self._buffer[t].clear()

    def set_checkpoint(self, name: str, position: int) -> None:
        self._checkpoints[name] = position

    def lock_checkpoint(self, name: str) -> int:
        # The store's lock already serializes transactions.
        return self._checkpoints.get(name, self._store.checkpoints.get(name, 0))

    def commit(self) -> None:
        for t in self._truncated:
            self._store.data[t].clear()
        for t, staged in self._staged.items():
            for key, row in staged.items():
                if row is None:
                    self._store.data[t].pop(key, None)
                else:
                    self._store.data[t][key] = row
        self._store.checkpoints.update(self._checkpoints)


class InMemoryProjectionStore:
    """A :class:`~gyre_store.projections.base.ProjectionStore` in dictionaries; a failed
    transaction leaves nothing behind, as a rolled-back database transaction would."""

    def __init__(self, tables: Mapping[str, sa.Table], log: EventLog | None = None) -> None:
        self.tables = dict(tables)
        self.log = log  # where ``payloads`` reads; a store of trees needs one
        self.data: dict[str, dict[Key, Row]] = {t: {} for t in tables}
        self.checkpoints: dict[str, int] = {}
        self._lock = threading.Lock()

    def checkpoint(self, name: str) -> int:
        return self.checkpoints.get(name, 0)

    @contextmanager
    def transaction(self) -> Iterator[RowStore]:
        with self._lock:
            rows = _MemoryRows(self)
            yield rows
            rows.flush()
            rows.commit()

    def dump(self, table: str) -> list[Row]:
        return [dict(self.data[table][k]) for k in sorted(self.data[table])]

    def select(self, table: str, column: str, value: object) -> list[Row]:
        data = self.data[table]
        return [dict(data[k]) for k in sorted(data) if data[k].get(column) == value]

    def select_in(
        self, table: str, column: str, value: object, among: str, keys: Sequence[object]
    ) -> list[Row]:
        data, wanted = self.data[table], set(keys)
        return [
            dict(data[k])
            for k in sorted(data)
            if data[k].get(column) == value and data[k].get(among) in wanted
        ]

    def payloads(self, positions: Sequence[int]) -> dict[int, bytes]:
        if self.log is None:
            raise ConfigError(
                "this in-memory projection store was made without its event log "
                "(InMemoryProjectionStore(tables, log=...)); tree nodes read their tokens from it"
            )
        out: dict[int, bytes] = {}
        for position in positions:
            found = self.log.read(position - 1, limit=1)
            if found and found[0].position == position and found[0].payload is not None:
                out[position] = found[0].payload.encode()
        return out
