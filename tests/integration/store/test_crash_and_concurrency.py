"""Faults and races on real PostgreSQL: killed writers, racing writers, overlapping commits."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from gyre_store import REGISTRY, NewEvent, PostgresEventLog, StoreConfig, StreamId, StreamVersionConflict
from gyre_store.catalog import ExecutionDispatched, ExecutionStarted

CHILD = Path(__file__).with_name("killed_writer.py")
ROOT = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def spawn(url: str, mode: str) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, str(CHILD), url, mode], stdout=subprocess.PIPE, text=True, env=env
    ) as child:
        try:
            yield child
        finally:
            if child.poll() is None:
                child.kill()


def assert_gapless(log: PostgresEventLog) -> None:
    positions = [e.position for e in log.read(0, limit=1_000_000)]
    assert positions == list(range(1, len(positions) + 1))


def test_writer_killed_mid_batch_leaves_no_partial_batch_and_no_gap(
    pg_log: PostgresEventLog, database_url: str
) -> None:
    pg_log.append([NewEvent(ExecutionStarted(execution_id="before", run_id="crash", engine="e"))])
    with spawn(database_url, "mid-batch") as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "READY"
        # The child's 500 rows are in its open transaction, holding the append lock.
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    # The server notices the dead client, rolls back and releases the lock.
    deadline = time.monotonic() + 30
    while True:
        try:
            pg_log.append([NewEvent(ExecutionStarted(execution_id="after", run_id="crash", engine="e"))])
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    events = pg_log.read(0)
    assert [e.event.execution_id for e in events] == ["before", "after"]  # type: ignore[attr-defined]
    assert_gapless(pg_log)


def test_writer_killed_at_a_random_moment_leaves_whole_batches_only(
    pg_log: PostgresEventLog, database_url: str
) -> None:
    with spawn(database_url, "loop") as child:
        assert child.stdout is not None
        for _ in range(5):
            child.stdout.readline()
        time.sleep(0.05)  # land somewhere inside a later batch
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    time.sleep(0.5)
    per_batch = collections.Counter(e.event.group_id for e in pg_log.read(0, limit=1_000_000))  # type: ignore[attr-defined]
    assert per_batch and set(per_batch.values()) == {50}
    assert_gapless(pg_log)


def test_concurrent_writers_to_one_stream_exactly_one_wins_each_version(database_url: str) -> None:
    writers, versions = 6, 8
    logs = [PostgresEventLog(StoreConfig(database_url, pool_max_size=1)).open() for _ in range(writers)]
    try:
        wins: collections.Counter[int] = collections.Counter()
        for version in range(versions):
            barrier = threading.Barrier(writers)

            def attempt(i: int, version: int = version, barrier: threading.Barrier = barrier) -> bool:
                barrier.wait()
                ev = ExecutionStarted(execution_id="contested", run_id="race", engine=f"w{i}")
                try:
                    logs[i].append([NewEvent(ev, expected_version=version)])
                    return True
                except StreamVersionConflict:
                    return False

            with ThreadPoolExecutor(writers) as pool:
                results = list(pool.map(attempt, range(writers)))
            wins[version] = sum(results)
        assert all(wins[v] == 1 for v in range(versions)), wins
        stream = logs[0].read_stream(StreamId("execution", "contested"))
        assert [e.stream_version for e in stream] == list(range(1, versions + 1))
    finally:
        for log in logs:
            log.close()


def test_the_first_to_take_a_position_commits_first(pg_log: PostgresEventLog, database_url: str) -> None:
    """Overlapping commits, case 1: T1 holds the append lock; T2 must wait and land after it."""
    encoded = [
        REGISTRY.encode(
            NewEvent(ExecutionDispatched(execution_id="t1", run_id="o", group_id="g", policy_version=0))
        )
    ]
    t2_done = threading.Event()
    t2_position: list[int] = []
    with psycopg.connect(database_url) as t1:
        head = pg_log.lock_and_head(t1)
        results = pg_log.plan_copy(t1, encoded, head)
        pg_log.copy_rows(t1, encoded, results)

        def t2() -> None:
            [r] = pg_log.append(
                [NewEvent(ExecutionDispatched(execution_id="t2", run_id="o", group_id="g", policy_version=0))]
            )
            t2_position.append(r.position)
            t2_done.set()

        thread = threading.Thread(target=t2)
        thread.start()
        assert not t2_done.wait(0.5), "T2 committed while T1 held the append lock"
        assert pg_log.read(0) == []  # a reader sees neither yet
        t1.commit()
    thread.join(10)
    assert t2_position == [2]
    assert [(e.position, e.event.execution_id) for e in pg_log.read(0)] == [(1, "t1"), (2, "t2")]  # type: ignore[attr-defined]


def test_a_tailing_reader_never_skips_under_concurrent_writers(database_url: str) -> None:
    """Overlapping commits, case 2: many writers commit while a reader tails by position."""
    writers, batches = 4, 40
    stop = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        with PostgresEventLog(StoreConfig(database_url, pool_max_size=1)) as log:
            last = 0
            while True:
                events = log.read(last, limit=500)
                seen.extend(e.position for e in events)
                if events:
                    last = events[-1].position
                elif stop.is_set():
                    return

    def writer(w: int) -> None:
        with PostgresEventLog(StoreConfig(database_url, pool_max_size=1, copy_threshold=4)) as log:
            for b in range(batches):
                size = 1 + (w + b) % 6  # mixes the function path and the COPY path
                log.append(
                    [
                        NewEvent(
                            ExecutionDispatched(
                                execution_id=f"w{w}-{b}-{i}", run_id="t", group_id="g", policy_version=0
                            )
                        )
                        for i in range(size)
                    ]
                )

    rt = threading.Thread(target=reader)
    rt.start()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(writer, range(writers)))
    stop.set()
    rt.join(30)
    total = sum(1 + (w + b) % 6 for w in range(writers) for b in range(batches))
    assert seen == list(range(1, total + 1))


@pytest.mark.parametrize(
    "statement", ["UPDATE gyre_events SET run_id = 'x'", "DELETE FROM gyre_events", "TRUNCATE gyre_events"]
)
def test_the_database_itself_refuses_to_change_history(
    pg_log: PostgresEventLog, database_url: str, statement: str
) -> None:
    pg_log.append([NewEvent(ExecutionStarted(execution_id="e", run_id="r", engine="x"))])
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.DatabaseError) as info:
            conn.execute(statement)
        assert info.value.sqlstate == "GY403"
    assert [e.event for e in pg_log.read(0)] == [ExecutionStarted(execution_id="e", run_id="r", engine="x")]


def as_role(url: str, role: str) -> str:
    return url + ("&" if "?" in url else "?") + f"options=-c%20role%3D{role}"


def test_writer_role_may_only_insert_and_select(database_url: str) -> None:
    with PostgresEventLog(StoreConfig(as_role(database_url, "gyre_writer"), copy_threshold=2)) as log:
        log.append([NewEvent(ExecutionStarted(execution_id="e", run_id="r", engine="x"))])  # function path
        log.append(
            [NewEvent(ExecutionStarted(execution_id=f"c{i}", run_id="r", engine="x")) for i in range(3)]
        )  # COPY
        assert log.head() == 4
    with psycopg.connect(as_role(database_url, "gyre_writer"), autocommit=True) as conn:
        for statement in (
            "UPDATE gyre_events SET run_id = 'x'",
            "DELETE FROM gyre_events",
            "TRUNCATE gyre_events",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


def test_auditor_role_may_only_read(pg_log: PostgresEventLog, database_url: str) -> None:
    pg_log.append([NewEvent(ExecutionStarted(execution_id="e", run_id="r", engine="x"))])
    with psycopg.connect(as_role(database_url, "gyre_auditor"), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM gyre_event_log_v").fetchone() == (1,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO gyre_checkpoints (name, position) VALUES ('x', 1)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "SELECT * FROM gyre_append_v1(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
            )
    with PostgresEventLog(StoreConfig(as_role(database_url, "gyre_auditor"))) as log:
        from gyre_store import GyreStoreError

        with pytest.raises(GyreStoreError, match="permission denied"):
            log.append([NewEvent(ExecutionStarted(execution_id="f", run_id="r", engine="x"))])
        assert log.head() == 1
