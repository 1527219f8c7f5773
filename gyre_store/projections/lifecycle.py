"""Projections of the run lifecycle: executions, the d/p/f counters, cell roles, policies.

The counters are the scheduler's d (dispatched), p (started) and f (finished); the SQL
view ``gyre_waterlevel_v`` derives queued, running and the waterlevel w = d - f from them.
"""

from __future__ import annotations

from typing import ClassVar

import sqlalchemy as sa

from gyre_store import schema
from gyre_store.catalog import (
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    WeightsPublished,
)
from gyre_store.log import RecordedEvent
from gyre_store.projections.base import Projection, ProjectionSet, RowStore


class ExecutionStatus:
    """Values of ``gyre_executions.status``."""

    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"


class ExecutionsProjection(Projection):
    """One row per execution with its lifecycle positions."""

    name: ClassVar[str] = "executions"
    tables: ClassVar[tuple[sa.Table, ...]] = (schema.executions,)
    event_types: ClassVar[frozenset[str]] = frozenset(
        {"execution.dispatched", "execution.started", "execution.finished"}
    )

    def apply(self, rows: RowStore, event: RecordedEvent) -> None:
        ev = event.event
        if isinstance(ev, ExecutionDispatched):
            rows.put(
                "gyre_executions",
                {
                    "execution_id": ev.execution_id,
                    "run_id": ev.run_id,
                    "group_id": ev.group_id,
                    "status": ExecutionStatus.QUEUED,
                    "finish_reason": None,
                    "policy_version": ev.policy_version,
                    "engine": None,
                    "dispatched_position": event.position,
                    "started_position": None,
                    "finished_position": None,
                },
            )
            return
        row = rows.get("gyre_executions", event.stream.id)
        if row is None:
            # A projection must never refuse an event already in the log (that would stall
            # it for good): an execution seen before its dispatch gets a row anyway.
            row = {
                "execution_id": event.stream.id,
                "run_id": getattr(ev, "run_id"),  # noqa: B009
                "group_id": "",
                "status": ExecutionStatus.QUEUED,
                "finish_reason": None,
                "policy_version": 0,
                "engine": None,
                "dispatched_position": event.position,
                "started_position": None,
                "finished_position": None,
            }
        if isinstance(ev, ExecutionStarted):
            row.update(status=ExecutionStatus.RUNNING, engine=ev.engine, started_position=event.position)
        elif isinstance(ev, ExecutionFinished):
            row.update(
                status=ExecutionStatus.FINISHED,
                finish_reason=ev.reason.value,
                finished_position=event.position,
            )
        rows.put("gyre_executions", row)


class CountersProjection(Projection):
    """The cumulative counters d, p, f of each run."""

    name: ClassVar[str] = "counters"
    tables: ClassVar[tuple[sa.Table, ...]] = (schema.counters,)
    event_types: ClassVar[frozenset[str]] = ExecutionsProjection.event_types

    _COLUMN: ClassVar[dict[str, str]] = {
        "execution.dispatched": "dispatched",
        "execution.started": "started",
        "execution.finished": "finished",
    }

    def apply(self, rows: RowStore, event: RecordedEvent) -> None:
        run_id = getattr(event.event, "run_id")  # noqa: B009 - every handled type has one
        row = rows.get("gyre_counters", run_id) or {
            "run_id": run_id,
            "dispatched": 0,
            "started": 0,
            "finished": 0,
            "as_of_position": 0,
        }
        row[self._COLUMN[event.event_type]] += 1
        row["as_of_position"] = event.position
        rows.put("gyre_counters", row)


class CellRolesProjection(Projection):
    """The current role of every cell."""

    name: ClassVar[str] = "cell_roles"
    tables: ClassVar[tuple[sa.Table, ...]] = (schema.cell_roles,)
    event_types: ClassVar[frozenset[str]] = frozenset({"cell.role_changed"})

    def apply(self, rows: RowStore, event: RecordedEvent) -> None:
        ev = event.event
        assert isinstance(ev, CellRoleChanged)
        # Whether ``ev.previous`` matches is checked when the transition is decided
        # (gyre_sched); the projection records what happened.
        row = rows.get("gyre_cell_roles", ev.run_id, ev.cell_index)
        rows.put(
            "gyre_cell_roles",
            {
                "run_id": ev.run_id,
                "cell_index": ev.cell_index,
                "role": ev.role.value,
                "transitions": (row["transitions"] if row else 0) + 1,
                "since_position": event.position,
            },
        )


class PolicyVersionsProjection(Projection):
    """Every published policy version of each run."""

    name: ClassVar[str] = "policy_versions"
    tables: ClassVar[tuple[sa.Table, ...]] = (schema.policy_versions,)
    event_types: ClassVar[frozenset[str]] = frozenset({"policy.published"})

    def apply(self, rows: RowStore, event: RecordedEvent) -> None:
        ev = event.event
        assert isinstance(ev, WeightsPublished)
        rows.put(
            "gyre_policy_versions",
            {
                "run_id": ev.run_id,
                "policy_version": ev.policy_version,
                "step": ev.step,
                "published_position": event.position,
            },
        )


def lifecycle_projections() -> ProjectionSet:
    """The projections of this module, ready to maintain or rebuild."""
    return ProjectionSet(
        [ExecutionsProjection(), CountersProjection(), CellRolesProjection(), PolicyVersionsProjection()]
    )
