"""The event log on PostgreSQL (psycopg 3 with a connection pool).

Small batches go through ``gyre_append_v1`` in one round trip; large ones take the same
advisory lock and stream rows with binary COPY. Driver errors are translated here and
nowhere else. An append whose events all carry idempotency keys is retried with backoff
while the database is unreachable: a retry of a batch that did commit is a no-op.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from types import TracebackType
from typing import Any

import psycopg
import psycopg.errors
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from gyre_store.config import StoreConfig
from gyre_store.exceptions import GyreStoreError, StoreBusy, StoreUnavailable, StreamVersionConflict
from gyre_store.log import queries
from gyre_store.log.events import (
    REGISTRY,
    AppendResult,
    EncodedEvent,
    EventMetadata,
    EventRegistry,
    NewEvent,
    RecordedEvent,
    StreamId,
    plan_append,
)
from gyre_store.log.payload import Payload


def _raw_json(data: Any) -> Any:
    return data


# SQLSTATEs that are about the server's state, not what was sent: the same statement may
# succeed when retried. (psycopg files most of them under OperationalError, together with
# 54xxx "program limit exceeded", which no retry fixes.)
_BUSY_STATES = frozenset({
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "25006",  # read_only_sql_transaction: connected to a standby, e.g. just after a failover
    "55P03",  # lock_not_available
    "57014",  # query_canceled: by an operator, or a statement timeout while a lock is held
})  # fmt: skip
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})  # shutdowns, too many connections


def translate(exc: psycopg.Error) -> GyreStoreError:
    """Map a driver error to the store's exception tree.

    ``StoreUnavailable`` (connection lost or refused, the server shutting down) and its
    ``StoreBusy`` (the server refused for now: see ``_BUSY_STATES``, insufficient resources,
    a system error) may succeed when retried; everything else is a refusal of what was sent
    (bad data, a constraint, a limit) or of the caller (privileges, schema) and is not.
    """
    state = getattr(exc, "sqlstate", None)
    if state == "GY409":
        detail = (exc.diag.message_detail or "").split("|", 3)
        expected, actual, stype, sid = [*detail, "0", "0", "?", "?"][:4]
        return StreamVersionConflict(
            exc.diag.message_primary or str(exc),
            stream_type=stype,
            stream_id=sid,
            expected=int(expected),
            actual=int(actual),
        )
    if isinstance(exc, psycopg.errors.UniqueViolation) and (
        exc.diag.constraint_name == "gyre_events_stream_version_uq"
    ):
        return StreamVersionConflict(
            f"another writer appended to the stream first ({exc.diag.message_detail})",
            stream_type="?",
            stream_id="?",
            expected=-1,
            actual=-1,
        )
    if state is None:  # raised by the client: no connection, or it broke (a pool timeout too)
        if isinstance(exc, psycopg.OperationalError):
            return StoreUnavailable(f"PostgreSQL is unavailable: {exc}")
    elif state[:2] == "08" or state in _UNAVAILABLE_STATES:
        return StoreUnavailable(f"PostgreSQL is unavailable: {exc}")
    elif state in _BUSY_STATES or state[:2] in ("53", "58"):  # insufficient resources, system error
        return StoreBusy(f"PostgreSQL refused for now ({state}); a retry may succeed: {exc}")
    return GyreStoreError(f"database error ({state}): {exc}")


def row_to_event(registry: EventRegistry, row: Sequence[Any]) -> RecordedEvent:
    """Build a RecordedEvent from a row selected with ``queries._SELECT``'s columns."""
    (pos, stype, sid, sver, etype, schema, eid, key, body, payload, corr, caus, run, policy, at) = row
    # Positional construction: this runs once per event read, on the hot read path.
    return RecordedEvent(
        pos,
        StreamId(stype, sid),
        sver,
        etype,
        schema,
        eid,
        key,
        registry.from_stored(etype, schema, body),
        Payload.decode(payload) if payload is not None else None,
        EventMetadata(corr, caus, run, policy),
        at,
    )


class PostgresEventLog:
    """An :class:`~gyre_store.log.interface.EventLog` on PostgreSQL. Use as a context manager."""

    def __init__(self, config: StoreConfig, registry: EventRegistry = REGISTRY) -> None:
        self.config = config
        self._registry = registry
        self.pool = ConnectionPool(
            config.psycopg_url,
            min_size=config.pool_min_size,
            max_size=config.pool_max_size,
            kwargs={"autocommit": True, "application_name": config.application_name},
            open=False,
            name="gyre-events",
        )
        # One LISTEN connection per thread that waits: threads sharing a log (a launcher and an
        # evaluator worker in one process) each block on their own, and none is lost to a race.
        self._listeners = threading.local()
        self._all_listeners: list[psycopg.Connection[Any]] = []
        self._listeners_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self, wait_s: float = 10.0) -> PostgresEventLog:
        try:
            self.pool.open(wait=True, timeout=wait_s)
        except psycopg.Error as exc:
            raise translate(exc) from exc
        except PoolTimeout as exc:  # not a psycopg.Error
            raise StoreUnavailable(f"cannot connect to PostgreSQL at {self._safe_url()}: {exc}") from exc
        return self

    def close(self) -> None:
        with self._listeners_lock:
            listeners, self._all_listeners = self._all_listeners, []
        for listener in listeners:
            listener.close()
        self.pool.close()

    def __enter__(self) -> PostgresEventLog:
        return self.open()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _safe_url(self) -> str:
        url = self.config.psycopg_url
        return url.split("@")[-1] if "@" in url else url

    @property
    def registry(self) -> EventRegistry:
        return self._registry

    # -- append ------------------------------------------------------------------------------
    def append(self, events: Sequence[NewEvent]) -> list[AppendResult]:
        if not events:
            return []
        encoded = [self._registry.encode(e, self.config.limits) for e in events]
        retry = self.config.retry
        retryable = all(e.idempotency_key is not None for e in events)
        deadline = time.monotonic() + retry.give_up_after_s
        backoff = retry.initial_backoff_s
        while True:
            try:
                with self.pool.connection() as conn:
                    if len(encoded) >= self.config.copy_threshold:
                        return self._append_copy(conn, encoded)
                    return self._append_function(conn, encoded)
            except psycopg.Error as exc:
                error = translate(exc)
                if not isinstance(error, StoreUnavailable):
                    raise error from exc  # a refusal (or a conflict): the same batch fails again
                if not retryable:
                    if isinstance(error, StoreBusy):
                        raise error from exc  # refused and rolled back: nothing committed
                    raise StoreUnavailable(
                        f"PostgreSQL became unavailable during an append ({exc}); the batch may or may "
                        "not have committed and has no idempotency keys, so it is not retried"
                    ) from exc
                if time.monotonic() + backoff > deadline:
                    raise type(error)(
                        f"PostgreSQL unavailable for {retry.give_up_after_s:.0f}s; giving up: {exc}"
                    ) from exc
            time.sleep(backoff)
            backoff = min(backoff * 2, retry.max_backoff_s)

    def _append_function(
        self, conn: psycopg.Connection[Any], batch: list[EncodedEvent]
    ) -> list[AppendResult]:
        if len(batch) == 1:
            # One event: scalar arguments cost the client far less than one-element arrays.
            e = batch[0]
            row = conn.execute(
                queries.APPEND_ONE,
                (
                    e.new.event_id,
                    e.stream.type,
                    e.stream.id,
                    e.new.expected_version,
                    e.event_type,
                    e.schema_version,
                    e.new.idempotency_key,
                    Jsonb(e.body, dumps=_raw_json),
                    e.payload,
                    e.metadata.correlation_id,
                    e.metadata.causation_id,
                    e.metadata.run_id,
                    e.metadata.policy_version,
                ),
                prepare=True,
            ).fetchone()
            assert row is not None
            return [AppendResult(int(row[0]), int(row[1]), bool(row[2]))]
        params = (
            [e.new.event_id for e in batch],
            [e.stream.type for e in batch],
            [e.stream.id for e in batch],
            [e.new.expected_version for e in batch],
            [e.event_type for e in batch],
            [e.schema_version for e in batch],
            [e.new.idempotency_key for e in batch],
            [Jsonb(e.body, dumps=_raw_json) for e in batch],
            [e.payload for e in batch],
            [e.metadata.correlation_id for e in batch],
            [e.metadata.causation_id for e in batch],
            [e.metadata.run_id for e in batch],
            [e.metadata.policy_version for e in batch],
        )
        rows = conn.execute(queries.APPEND_SMALL, params, prepare=True).fetchall()
        return [AppendResult(int(p), int(v), bool(d)) for p, v, d in rows]

    def _append_copy(self, conn: psycopg.Connection[Any], batch: list[EncodedEvent]) -> list[AppendResult]:
        with conn.transaction():
            head = self.lock_and_head(conn)
            results = self.plan_copy(conn, batch, head)
            self.copy_rows(conn, batch, results)
        return results

    @staticmethod
    def lock_and_head(conn: psycopg.Connection[Any]) -> int:
        """Take the append lock (until the transaction ends) and return the head position."""
        row = conn.execute(queries.LOCK_AND_HEAD).fetchone()
        assert row is not None
        return int(row[0])

    @staticmethod
    def plan_copy(conn: psycopg.Connection[Any], batch: list[EncodedEvent], head: int) -> list[AppendResult]:
        """Decide each event's position and version under the lock, as the function would."""
        keys = [e.new.idempotency_key for e in batch if e.new.idempotency_key is not None]
        existing: dict[str, AppendResult] = {}
        if keys:
            for key, pos, ver in conn.execute(queries.EXISTING_KEYS, (keys,)):
                existing[key] = AppendResult(int(pos), int(ver), duplicate=True)
        streams = sorted({e.stream for e in batch})
        versions: dict[StreamId, int] = {
            StreamId(t, i): int(v)
            for t, i, v in conn.execute(
                queries.STREAM_HEADS, ([s.type for s in streams], [s.id for s in streams])
            )
        }
        return plan_append(batch, head, versions, existing)

    @staticmethod
    def copy_rows(
        conn: psycopg.Connection[Any], batch: list[EncodedEvent], results: list[AppendResult]
    ) -> None:
        with conn.cursor() as cur, cur.copy(queries.COPY_EVENTS) as copy:
            copy.set_types(list(queries.COPY_TYPES))
            for e, r in zip(batch, results, strict=True):
                if r.duplicate:
                    continue
                m = e.metadata
                copy.write_row(
                    (
                        r.position,
                        e.stream.type,
                        e.stream.id,
                        r.stream_version,
                        e.event_type,
                        e.schema_version,
                        e.new.event_id,
                        e.new.idempotency_key,
                        Jsonb(e.body, dumps=_raw_json),
                        e.payload,
                        m.correlation_id,
                        m.causation_id,
                        m.run_id,
                        m.policy_version,
                    )
                )

    # -- read --------------------------------------------------------------------------------
    def read(
        self,
        after: int = 0,
        *,
        limit: int = 1000,
        until: int | None = None,
        types: Collection[str] | None = None,
    ) -> list[RecordedEvent]:
        upper = until if until is not None else 2**62
        try:
            with self.pool.connection() as conn, conn.cursor(binary=True) as cur:
                if types is None:
                    cur.execute(queries.READ_LOG, (after, upper, limit), prepare=True)
                else:
                    cur.execute(queries.READ_LOG_TYPES, (after, upper, list(types), limit), prepare=True)
                rows = cur.fetchall()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return [row_to_event(self._registry, r) for r in rows]

    def read_stream(self, stream: StreamId, *, after_version: int = 0) -> list[RecordedEvent]:
        try:
            with self.pool.connection() as conn, conn.cursor(binary=True) as cur:
                cur.execute(queries.READ_STREAM, (stream.type, stream.id, after_version))
                rows = cur.fetchall()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return [row_to_event(self._registry, r) for r in rows]

    def head(self) -> int:
        try:
            with self.pool.connection() as conn:
                row = conn.execute(queries.HEAD, prepare=True).fetchone()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        assert row is not None
        return int(row[0])

    def wait(self, after: int, timeout: float) -> bool:
        if self.head() > after:
            return True
        listener: psycopg.Connection[Any] | None = getattr(self._listeners, "connection", None)
        try:
            if listener is None or listener.closed:
                listener = psycopg.connect(self.config.psycopg_url, autocommit=True)
                with self._listeners_lock:
                    self._all_listeners.append(listener)
                self._listeners.connection = listener
                listener.execute(queries.LISTEN)
                # The head may have moved between our check and LISTEN taking effect.
                if self.head() > after:
                    return True
            for _ in listener.notifies(timeout=timeout, stop_after=1):
                break
        except psycopg.Error as exc:
            if listener is not None:
                listener.close()
                with self._listeners_lock:
                    if listener in self._all_listeners:
                        self._all_listeners.remove(listener)
                self._listeners.connection = None
            raise translate(exc) from exc
        return self.head() > after
