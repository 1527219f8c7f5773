"""Projections: tables derived from the event log, maintained incrementally, rebuildable.

A projection is a fold over events into rows of its own tables. It reads and writes rows
only through a ``RowStore``, so the same projection runs on PostgreSQL (live, or into a
replay schema) and in memory. Rows and the projection's checkpoint are written in one
transaction: a crash between them cannot make a projection skip or double-apply events.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

import sqlalchemy as sa

from gyre_store.exceptions import ProjectionError, UnknownProjection
from gyre_store.log import EventLog, RecordedEvent

Row = dict[str, Any]
Key = tuple[Any, ...]
_DELETED: Row = {}


class RowStore(ABC):
    """What a projection sees inside one transaction: keyed rows of its tables.

    Writes are buffered and reach storage at :meth:`flush` (called by the projector at
    batch ends), so a projection over many events costs one bulk write per batch.
    """

    def __init__(self, tables: Mapping[str, sa.Table]) -> None:
        self.tables = tables
        self._buffer: dict[str, dict[Key, Row]] = {name: {} for name in tables}
        self._pk: dict[str, tuple[str, ...]] = {
            name: tuple(c.name for c in t.primary_key.columns) for name, t in tables.items()
        }
        self._columns: dict[str, frozenset[str]] = {
            name: frozenset(c.name for c in t.columns) for name, t in tables.items()
        }
        self._dirty: set[str] = set()

    def key_of(self, table: str, row: Mapping[str, Any]) -> Key:
        return tuple(row[c] for c in self._pk[table])

    def get(self, table: str, *key: Any) -> Row | None:
        """The row of ``table`` with primary key ``key``, or None."""
        buf = self._buffer[table]
        if key in buf:
            row = buf[key]
            return None if row is _DELETED else dict(row)
        loaded = self._load(table, key)
        buf[key] = _DELETED if loaded is None else loaded
        return None if loaded is None else dict(loaded)

    def put(self, table: str, row: Mapping[str, Any]) -> None:
        """Insert or replace a whole row."""
        missing = self._columns[table] - row.keys()
        extra = row.keys() - self._columns[table]
        if missing or extra:
            raise ProjectionError(
                f"row for {table} has missing {sorted(missing)} / unknown {sorted(extra)} columns"
            )
        self._buffer[table][self.key_of(table, row)] = dict(row)
        self._dirty.add(table)

    def delete(self, table: str, *key: Any) -> None:
        self._buffer[table][key] = _DELETED
        self._dirty.add(table)

    def flush(self) -> None:
        """Write buffered rows to storage (still inside the transaction)."""
        upserts: dict[str, list[Row]] = {}
        deletes: dict[str, list[Key]] = {}
        for table in sorted(self._dirty):
            for key, row in self._buffer[table].items():
                if row is _DELETED:
                    deletes.setdefault(table, []).append(key)
                else:
                    upserts.setdefault(table, []).append(row)
        self._write(upserts, deletes)
        # The buffer stays as a read cache for the rest of the transaction.
        self._dirty.clear()

    @abstractmethod
    def _load(self, table: str, key: Key) -> Row | None: ...

    @abstractmethod
    def _write(self, upserts: Mapping[str, list[Row]], deletes: Mapping[str, list[Key]]) -> None: ...

    @abstractmethod
    def payloads(self, positions: Sequence[int]) -> dict[int, bytes]:
        """The stored binary payload of each event at ``positions`` that has one, read from the
        log (a tree split counts the trainable tokens of the payload slice it cuts)."""

    @abstractmethod
    def truncate(self, tables: Sequence[str]) -> None:
        """Empty ``tables`` (inside the transaction)."""

    @abstractmethod
    def set_checkpoint(self, name: str, position: int) -> None: ...

    @abstractmethod
    def lock_checkpoint(self, name: str) -> int:
        """Take the projection's lock until the transaction ends; return its checkpoint.

        Two projectors of the same projection (a trainer and a CLI, say) must not both
        apply the events after one checkpoint: the second waits, then starts where the
        first stopped.
        """


class ProjectionStore(Protocol):
    """Where projections keep their rows and checkpoints."""

    def checkpoint(self, name: str) -> int: ...

    def transaction(self) -> AbstractContextManager[RowStore]: ...

    def dump(self, table: str) -> list[Row]:
        """All rows of ``table`` sorted by primary key (for tests, replay output, audits)."""
        ...

    def select(self, table: str, column: str, value: Any) -> list[Row]:
        """Committed rows of ``table`` whose ``column`` equals ``value``, by primary key."""
        ...

    def select_in(self, table: str, column: str, value: Any, among: str, keys: Sequence[Any]) -> list[Row]:
        """Committed rows of ``table`` whose ``column`` equals ``value`` and whose ``among``
        is one of ``keys``, by primary key (a few nodes of one tree, say)."""
        ...

    def payloads(self, positions: Sequence[int]) -> dict[int, bytes]:
        """The stored binary payload of each event at ``positions`` that has one (a tree node's
        token ids are a slice of its record's payload, not a copy)."""
        ...


class Projection(ABC):
    """A fold of events into rows. Subclasses set ``name``, ``tables`` and ``event_types``."""

    name: ClassVar[str]
    tables: ClassVar[tuple[sa.Table, ...]]
    event_types: ClassVar[frozenset[str]]

    @property
    def checkpoint_name(self) -> str:
        return f"projection:{self.name}"

    @abstractmethod
    def apply(self, rows: RowStore, event: RecordedEvent) -> None:
        """Apply one event. Must be deterministic: a rebuild has to reproduce the live rows."""


def _apply(rows: RowStore, projection: Projection, events: Sequence[RecordedEvent]) -> None:
    for event in events:
        try:
            projection.apply(rows, event)
        except ProjectionError:
            raise
        except Exception as exc:
            raise ProjectionError(
                f"projection {projection.name} failed on event {event.position} ({event.event_type}): {exc}"
            ) from exc
    rows.flush()


def catch_up(
    log: EventLog,
    store: ProjectionStore,
    projection: Projection,
    *,
    until: int | None = None,
    batch: int = 1000,
) -> int:
    """Apply every event after the projection's checkpoint; return the new checkpoint.

    Each batch commits together with its checkpoint, so an interrupted catch-up resumes
    exactly where the last committed batch ended.
    """
    end = log.head() if until is None else until
    name = projection.checkpoint_name
    while True:
        with store.transaction() as rows:
            position = rows.lock_checkpoint(name)
            if position >= end:
                return position
            events = log.read(position, limit=batch, until=end, types=projection.event_types)
            # A short batch means nothing relevant remains up to ``end``: all of it is handled.
            stop = events[-1].position if len(events) == batch else end
            _apply(rows, projection, events)
            rows.set_checkpoint(name, stop)


def rebuild(
    log: EventLog,
    store: ProjectionStore,
    projection: Projection,
    *,
    until: int | None = None,
    batch: int = 1000,
) -> int:
    """Drop the projection's rows and fold the log again up to ``until``, in one transaction."""
    end = log.head() if until is None else until
    with store.transaction() as rows:
        rows.lock_checkpoint(projection.checkpoint_name)
        rows.truncate([t.name for t in projection.tables])
        position = 0
        while position < end:
            events = log.read(position, limit=batch, until=end, types=projection.event_types)
            if not events:
                break
            _apply(rows, projection, events)
            position = events[-1].position
        rows.set_checkpoint(projection.checkpoint_name, end)
    return end


class ProjectionSet:
    """The projections a deployment maintains, addressable by name."""

    def __init__(self, projections: Sequence[Projection]) -> None:
        self._by_name = {p.name: p for p in projections}
        if len(self._by_name) != len(projections):
            raise ValueError("two projections share a name")

    def __iter__(self) -> Iterator[Projection]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> Projection:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownProjection(
                f"no projection named {name!r}; known: {', '.join(sorted(self._by_name))}"
            ) from None

    def tables(self) -> dict[str, sa.Table]:
        return {t.name: t for p in self for t in p.tables}
