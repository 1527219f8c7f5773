"""Store an in-memory log's records in PostgreSQL and build the tree projection there.

The tree benchmarks generate executions into an ``InMemoryEventLog`` (fast, no database in
the loop) and then time what a live run reads back: this copies the records into a
PostgreSQL log as a live run appends them and catches the tree projection up over them.
"""

from __future__ import annotations

from collections.abc import Sequence

from gyre_store import NewEvent, PostgresEventLog, PostgresProjectionStore, RecordedEvent, catch_up
from gyre_store.trees import TreeProjection

APPEND_BATCH = 64  # records per append


def store_and_project(pg_log: PostgresEventLog, events: Sequence[RecordedEvent]) -> PostgresProjectionStore:
    """Append ``events`` to ``pg_log`` (keys and payloads kept) and catch the tree projection
    up over them; return the projection store holding the trees."""
    for i in range(0, len(events), APPEND_BATCH):
        pg_log.append(
            [
                NewEvent(e.event, idempotency_key=e.idempotency_key, payload=e.payload)
                for e in events[i : i + APPEND_BATCH]
            ]
        )
    projection = TreeProjection()
    store = PostgresProjectionStore(pg_log.pool, {t.name: t for t in projection.tables})
    catch_up(pg_log, store, projection)
    return store
