"""Projections: tables folded incrementally from the log, each writing its rows and its
checkpoint in one transaction, rebuildable by replay (lifecycle counters, cell roles,
policy versions, evaluations and rollout groups). Trajectory trees are ``gyre_store.trees``.
"""

from __future__ import annotations

from gyre_store.projections.base import (
    Key,
    Projection,
    ProjectionSet,
    ProjectionStore,
    Row,
    RowStore,
    catch_up,
    rebuild,
)
from gyre_store.projections.groups import (
    EvaluationsProjection,
    GroupsProjection,
    GroupStatus,
    OutcomeStatus,
    evaluation_projections,
)
from gyre_store.projections.lifecycle import (
    CellRolesProjection,
    CountersProjection,
    ExecutionsProjection,
    ExecutionStatus,
    PolicyVersionsProjection,
    lifecycle_projections,
)
from gyre_store.projections.postgres import PostgresProjectionStore

__all__ = [
    "CellRolesProjection",
    "CountersProjection",
    "EvaluationsProjection",
    "ExecutionStatus",
    "ExecutionsProjection",
    "GroupStatus",
    "GroupsProjection",
    "Key",
    "OutcomeStatus",
    "PolicyVersionsProjection",
    "PostgresProjectionStore",
    "Projection",
    "ProjectionSet",
    "ProjectionStore",
    "Row",
    "RowStore",
    "catch_up",
    "evaluation_projections",
    "lifecycle_projections",
    "rebuild",
]
