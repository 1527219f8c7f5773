"""The record spool on PostgreSQL: a record the database refuses for good (a NUL in a JSON
string) is set aside and the ones behind it are written; a database that refuses writes for a
while (a read-only server, as just after a failover) is waited out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gyre_proxy.ingest import RecordSpool
from gyre_proxy.ingest.spool_files import DeadLetters
from gyre_store import (
    ExecutionStarted,
    NewEvent,
    PostgresEventLog,
    RecordQuarantined,
    RetryPolicy,
    StoreBusy,
    StoreConfig,
)
from gyre_store.trees import TrajectoryRecorder


def started(ex: str, engine: str = "e") -> NewEvent:
    return NewEvent(ExecutionStarted(execution_id=ex, run_id="r", engine=engine), idempotency_key=f"s:{ex}")


def started_ids(log: PostgresEventLog) -> list[str]:
    return [r.event.execution_id for r in log.read(0) if isinstance(r.event, ExecutionStarted)]


def test_a_record_postgres_refuses_for_good_is_set_aside_and_the_rest_written(
    pg_log: PostgresEventLog, tmp_path: Path
) -> None:
    spool = RecordSpool(TrajectoryRecorder(pg_log), directory=tmp_path, linger_s=0.2)
    for record in (started("a"), started("b", engine="bad\x00byte"), started("c")):
        spool.submit(record)
    assert spool.flush(30)
    spool.close()
    assert started_ids(pg_log) == ["a", "c"]
    [letter] = DeadLetters(tmp_path / "dead-letter.jsonl").read()
    assert letter["body"]["engine"] == "bad\x00byte" and "22P05" in letter["error"]
    [note] = [r.event for r in pg_log.read(0) if isinstance(r.event, RecordQuarantined)]
    assert note.record_stream == "execution:b" and "22P05" in note.error


@pytest.fixture
def admin(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


def test_a_read_only_database_is_busy_and_waited_out(
    database_url: str, admin: psycopg.Connection[tuple[object, ...]], tmp_path: Path
) -> None:
    name = database_url.rsplit("/", 1)[-1]
    admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    config = StoreConfig(database_url, retry=RetryPolicy(give_up_after_s=0.5))
    with PostgresEventLog(config) as log:
        with pytest.raises(StoreBusy, match="25006"):
            log.append([NewEvent(ExecutionStarted(execution_id="x", run_id="r", engine="e"))])
        spool = RecordSpool(TrajectoryRecorder(log), directory=tmp_path, max_backoff_s=0.05)
        spool.submit(started("a"))
        deadline = time.monotonic() + 30
        while spool.retries < 2:
            assert time.monotonic() < deadline, "the spool did not retry"
            time.sleep(0.05)
        assert spool.pending == 1 and spool.quarantined == 0
        # Writable again; the sessions opened read-only are ended, and the pool opens new ones.
        admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        assert spool.flush(60)
        spool.close()
        assert started_ids(log) == ["a"] and spool.quarantined == 0
