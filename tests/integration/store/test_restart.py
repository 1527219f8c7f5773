"""PostgreSQL restarted under a writer: it reports, retries with backoff and loses nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from gyre_store import NewEvent, PostgresEventLog, RetryPolicy, StoreConfig, StoreUnavailable
from gyre_store.catalog import ExecutionStarted
from gyre_store.db import migrate
from tests import pgcluster
from tests.real_servers import require


@pytest.fixture(autouse=True)
def _postgres_binaries() -> None:
    require("postgres_binaries", pgcluster.missing())


@pytest.fixture
def cluster() -> Iterator[pgcluster.PrivateCluster]:
    c = pgcluster.PrivateCluster().init()
    migrate.upgrade(c.url)
    yield c
    c.destroy()


def event(i: int) -> NewEvent:
    return NewEvent(
        ExecutionStarted(execution_id=f"e{i}", run_id="restart", engine="x"), idempotency_key=f"start-e{i}"
    )


def test_appends_with_keys_survive_a_restart_without_loss_or_duplicates(
    cluster: pgcluster.PrivateCluster,
) -> None:
    total = 300
    config = StoreConfig(
        cluster.url, retry=RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=60)
    )
    halfway, stopped = threading.Event(), threading.Event()

    def restart() -> None:
        halfway.wait(30)
        cluster.stop("fast")
        stopped.set()
        time.sleep(1.0)
        cluster.start()

    with PostgresEventLog(config) as log:
        thread = threading.Thread(target=restart)
        thread.start()
        for i in range(total):
            if i == total // 2:
                halfway.set()
                stopped.wait(30)
                began = time.monotonic()
                log.append([event(i)])  # the database is down: this one waits it out
                blocked_s = time.monotonic() - began
            else:
                log.append([event(i)])
        thread.join(30)
        assert blocked_s > 0.5, "the append during the outage did not have to wait: no outage was exercised"
        events = log.read(0, limit=10_000)
        assert [e.event.execution_id for e in events] == [f"e{i}" for i in range(total)]  # type: ignore[attr-defined]
        assert [e.position for e in events] == list(range(1, total + 1))


def test_appends_without_keys_are_reported_not_retried(cluster: pgcluster.PrivateCluster) -> None:
    with PostgresEventLog(StoreConfig(cluster.url)) as log:
        log.append([NewEvent(ExecutionStarted(execution_id="a", run_id="r", engine="x"))])
        cluster.stop("fast")
        try:
            with pytest.raises(StoreUnavailable, match=r"not retried|unavailable"):
                log.append([NewEvent(ExecutionStarted(execution_id="b", run_id="r", engine="x"))])
        finally:
            cluster.start()
        log.append([NewEvent(ExecutionStarted(execution_id="c", run_id="r", engine="x"))])
        assert [e.event.execution_id for e in log.read(0)] == ["a", "c"]  # type: ignore[attr-defined]


def test_unreachable_database_is_a_typed_error() -> None:
    config = StoreConfig("postgresql://postgres@127.0.0.1:1/none?connect_timeout=1")
    with pytest.raises(StoreUnavailable):
        PostgresEventLog(config).open(wait_s=1.0)
