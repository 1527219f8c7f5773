"""Projections in memory: rebuild equals incremental, replay as of a position, atomicity."""

from __future__ import annotations

from typing import ClassVar

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_store import (
    InMemoryEventLog,
    InMemoryProjectionStore,
    NewEvent,
    Projection,
    ProjectionError,
    RecordedEvent,
    RowStore,
    UnknownProjection,
    catch_up,
    lifecycle_projections,
    rebuild,
)
from gyre_store import schema as tables
from gyre_store.catalog import ExecutionDispatched, ExecutionStarted
from tests.unit.store.lifecycle_strategy import lifecycle_events


def dump_all(store: InMemoryProjectionStore) -> dict[str, list[dict[str, object]]]:
    return {t: store.dump(t) for t in store.tables}


@settings(max_examples=60)
@given(lifecycle_events(), st.lists(st.integers(1, 10), min_size=1, max_size=8), st.integers(1, 7))
def test_rebuild_equals_incremental(events: list[NewEvent], chunks: list[int], batch: int) -> None:
    log = InMemoryEventLog()
    projections = lifecycle_projections()
    live = InMemoryProjectionStore(projections.tables())
    i = 0
    for size in chunks * 10:
        if i >= len(events):
            break
        log.append(events[i : i + size])
        i += size
        for p in projections:
            catch_up(log, live, p, batch=batch)
    log.append(events[i:])
    for p in projections:
        catch_up(log, live, p, batch=batch)
    fresh = InMemoryProjectionStore(projections.tables())
    for p in projections:
        rebuild(log, fresh, p)
    assert dump_all(fresh) == dump_all(live)
    assert all(live.checkpoint(p.checkpoint_name) == log.head() for p in projections)


def test_counters_match_the_lifecycle_and_replay_shows_the_past() -> None:
    log = InMemoryEventLog()
    log.append(
        [
            NewEvent(ExecutionDispatched(execution_id=f"e{i}", run_id="r", group_id="g", policy_version=0))
            for i in range(4)
        ]
    )
    middle = log.head()
    log.append([NewEvent(ExecutionStarted(execution_id=f"e{i}", run_id="r", engine="c0")) for i in range(3)])
    counters = lifecycle_projections().get("counters")
    store = InMemoryProjectionStore({t.name: t for t in counters.tables})
    catch_up(log, store, counters)
    assert store.dump("gyre_counters") == [
        {"run_id": "r", "dispatched": 4, "started": 3, "finished": 0, "as_of_position": 7}
    ]
    past = InMemoryProjectionStore({t.name: t for t in counters.tables})
    rebuild(log, past, counters, until=middle)
    assert past.dump("gyre_counters")[0]["started"] == 0
    assert store.dump("gyre_counters")[0]["started"] == 3  # the live one is untouched


class Exploding(Projection):
    name: ClassVar[str] = "exploding"
    tables: ClassVar[tuple[sa.Table, ...]] = (tables.counters,)
    event_types: ClassVar[frozenset[str]] = frozenset({"execution.dispatched", "execution.started"})

    def apply(self, rows: RowStore, event: RecordedEvent) -> None:
        if event.event_type == "execution.started":
            raise RuntimeError("boom")
        row = rows.get("gyre_counters", "r") or {
            "run_id": "r",
            "dispatched": 0,
            "started": 0,
            "finished": 0,
            "as_of_position": 0,
        }
        row["dispatched"] += 1
        rows.put("gyre_counters", row)


def test_a_failing_batch_commits_neither_rows_nor_checkpoint() -> None:
    log = InMemoryEventLog()
    log.append([NewEvent(ExecutionDispatched(execution_id="a", run_id="r", group_id="g", policy_version=0))])
    store = InMemoryProjectionStore({"gyre_counters": tables.counters})
    projection = Exploding()
    assert catch_up(log, store, projection) == 1
    log.append(
        [
            NewEvent(ExecutionDispatched(execution_id="b", run_id="r", group_id="g", policy_version=0)),
            NewEvent(ExecutionStarted(execution_id="b", run_id="r", engine="x")),
        ]
    )
    with pytest.raises(ProjectionError, match="event 3"):
        catch_up(log, store, projection)
    assert store.checkpoint(projection.checkpoint_name) == 1
    assert store.dump("gyre_counters")[0]["dispatched"] == 1


def test_rows_with_wrong_columns_and_unknown_projection_names_are_errors() -> None:
    store = InMemoryProjectionStore({"gyre_counters": tables.counters})
    with pytest.raises(ProjectionError, match="missing"), store.transaction() as rows:
        rows.put("gyre_counters", {"run_id": "r"})
    with pytest.raises(UnknownProjection, match="known"):
        lifecycle_projections().get("nope")
