"""Migrations, schema-versus-models, projections and replay on real PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre_store import (
    NewEvent,
    PostgresEventLog,
    PostgresProjectionStore,
    StoreConfig,
    catch_up,
    lifecycle_projections,
    rebuild,
)
from gyre_store.db import migrate
from tests import pg
from tests.unit.store.lifecycle_strategy import lifecycle_events
from tests.unit.store.test_events_and_payload import make_registries


def test_upgrade_on_an_empty_database_matches_the_models_and_downgrades_cleanly() -> None:
    name = "gyre_mig_" + __import__("uuid").uuid4().hex[:8]
    with pg.admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg.url_for(name)
    try:
        migrate.upgrade(url)
        assert migrate.current_revision(url) == migrate.head_revision()
        assert migrate.schema_differences(url) == []
        migrate.downgrade(url, "base")
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
        assert left == [("gyre_alembic_version",)]
        migrate.upgrade(url)
        assert migrate.schema_differences(url) == []
    finally:
        pg.drop(name)


def test_schema_check_notices_drift(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE gyre_counters ADD COLUMN surprise integer")
    diffs = migrate.schema_differences(database_url)
    assert any("surprise" in str(d) for d in diffs)


def test_old_bodies_in_the_database_are_upcast_on_read(database_url: str) -> None:
    old, new = make_registries()
    with PostgresEventLog(StoreConfig(database_url), registry=old) as log:
        log.append([NewEvent(old.type_of("thing.happened")(thing_id="t", size=3))])  # type: ignore[call-arg]
    with PostgresEventLog(StoreConfig(database_url), registry=new) as log:
        [ev] = log.read(0)
    assert ev.schema_version == 1
    assert ev.event.size_bytes == 3072  # type: ignore[attr-defined]


# The list replaces the profile's (tests/conftest.py), so it names too_slow again.
@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=lifecycle_events(), split=st.integers(1, 15))
def test_rebuild_equals_incremental_on_postgres(pg_template: str, events: list[NewEvent], split: int) -> None:
    projections = lifecycle_projections()
    with pg.database_from(pg_template) as url, PostgresEventLog(StoreConfig(url, copy_threshold=4)) as log:
        live = PostgresProjectionStore(log.pool, projections.tables())
        for i in range(0, len(events), split):
            log.append(events[i : i + split])
            for p in projections:
                catch_up(log, live, p, batch=3)
        replica = PostgresProjectionStore(log.pool, projections.tables(), schema="rebuilt")
        replica.create_schema()
        for p in projections:
            rebuild(log, replica, p)
        for table in projections.tables():
            assert replica.dump(table) == live.dump(table)
        # and rebuilding the live tables in place gives the same rows again
        before = {t: live.dump(t) for t in projections.tables()}
        for p in projections:
            rebuild(log, live, p)
        assert {t: live.dump(t) for t in projections.tables()} == before


def test_replay_schema_leaves_live_projections_alone(pg_log: PostgresEventLog) -> None:
    from gyre_store.catalog import ExecutionDispatched, ExecutionStarted

    pg_log.append(
        [
            NewEvent(ExecutionDispatched(execution_id=f"e{i}", run_id="r", group_id="g", policy_version=0))
            for i in range(3)
        ]
    )
    pg_log.append(
        [NewEvent(ExecutionStarted(execution_id=f"e{i}", run_id="r", engine="c0")) for i in range(3)]
    )
    projections = lifecycle_projections()
    live = PostgresProjectionStore(pg_log.pool, projections.tables())
    for p in projections:
        catch_up(pg_log, live, p)
    past = PostgresProjectionStore(pg_log.pool, projections.tables(), schema="as_of_3")
    past.create_schema()
    for p in projections:
        rebuild(pg_log, past, p, until=3)
    assert [r["status"] for r in past.dump("gyre_executions")] == ["queued"] * 3
    assert [r["status"] for r in live.dump("gyre_executions")] == ["running"] * 3
    with pytest.raises(Exception, match="live schema"):
        PostgresProjectionStore(pg_log.pool, projections.tables()).create_schema()


def test_a_reader_that_does_not_know_a_type_still_reads_the_log(database_url: str) -> None:
    from gyre_store import EventRegistry
    from gyre_store.log import OpaqueEvent

    _, new = make_registries()
    with PostgresEventLog(StoreConfig(database_url), registry=new) as log:
        log.append([NewEvent(new.type_of("thing.happened")(thing_id="t", size_bytes=1, unit="B"))])  # type: ignore[call-arg]
    with PostgresEventLog(StoreConfig(database_url), registry=EventRegistry()) as log:
        [ev] = log.read(0)
    assert isinstance(ev.event, OpaqueEvent)
    assert ev.event.type_name == "thing.happened" and b"size_bytes" in bytes(ev.event.body)


def test_concurrent_projectors_apply_each_event_once(pg_log: PostgresEventLog) -> None:
    import threading

    from gyre_store.catalog import ExecutionDispatched

    for i in range(0, 600, 100):
        pg_log.append(
            [
                NewEvent(
                    ExecutionDispatched(execution_id=f"c{j}", run_id="r", group_id="g", policy_version=0)
                )
                for j in range(i, i + 100)
            ]
        )
    counters = lifecycle_projections().get("counters")
    store = PostgresProjectionStore(pg_log.pool, {t.name: t for t in counters.tables})
    threads = [
        threading.Thread(target=catch_up, args=(pg_log, store, counters), kwargs={"batch": 37})
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    [row] = store.dump("gyre_counters")
    assert row["dispatched"] == 600
    assert store.checkpoint(counters.checkpoint_name) == pg_log.head()
