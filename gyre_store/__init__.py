"""gyre_store: the event log, typed events, projections and replay of a gyre run.

The log lives in PostgreSQL (``PostgresEventLog``) or in memory (``InMemoryEventLog``);
everything else in gyre reads and writes through these names.
"""

from __future__ import annotations

from gyre_store.catalog import training as training_events  # noqa: F401  (registers the train.* event types)
from gyre_store.catalog.evaluation import (
    ArtifactPreserved,
    EvaluationErrorKind,
    EvaluationFailed,
    EvaluationRecorded,
    EvaluationStatus,
    ExclusionReason,
    ExecutionExcluded,
    GroupConsumed,
    PlaceholderInserted,
    RewardAssigned,
    consumption_key,
    new_outcome,
    outcome_key,
)
from gyre_store.catalog.run import (
    REGISTRY,
    CellRole,
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    GroupDispatched,
    RunStarted,
    WeightsPublished,
)
from gyre_store.config import RetryPolicy, StoreConfig
from gyre_store.exceptions import (
    ConfigError,
    EventValidationError,
    GyreStoreError,
    MalformedEvent,
    PayloadTooLarge,
    ProjectionError,
    StoreUnavailable,
    StreamVersionConflict,
    UnknownEventType,
    UnknownProjection,
)
from gyre_store.log.events import (
    AppendResult,
    Event,
    EventMetadata,
    EventRegistry,
    Limits,
    NewEvent,
    RecordedEvent,
    StreamId,
)
from gyre_store.log.interface import EventLog, iterate, subscribe
from gyre_store.log.payload import Payload
from gyre_store.log.postgres import PostgresEventLog
from gyre_store.projections.base import (
    Projection,
    ProjectionSet,
    ProjectionStore,
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
from gyre_store.projections.lifecycle import lifecycle_projections
from gyre_store.projections.postgres import PostgresProjectionStore
from gyre_store.testing import InMemoryEventLog, InMemoryProjectionStore

__all__ = [
    "REGISTRY",
    "AppendResult",
    "ArtifactPreserved",
    "CellRole",
    "CellRoleChanged",
    "ConfigError",
    "EvaluationErrorKind",
    "EvaluationFailed",
    "EvaluationRecorded",
    "EvaluationStatus",
    "EvaluationsProjection",
    "Event",
    "EventLog",
    "EventMetadata",
    "EventRegistry",
    "EventValidationError",
    "ExclusionReason",
    "ExecutionDispatched",
    "ExecutionExcluded",
    "ExecutionFinished",
    "ExecutionStarted",
    "FinishReason",
    "GroupConsumed",
    "GroupDispatched",
    "GroupStatus",
    "GroupsProjection",
    "GyreStoreError",
    "InMemoryEventLog",
    "InMemoryProjectionStore",
    "Limits",
    "MalformedEvent",
    "NewEvent",
    "OutcomeStatus",
    "Payload",
    "PayloadTooLarge",
    "PlaceholderInserted",
    "PostgresEventLog",
    "PostgresProjectionStore",
    "Projection",
    "ProjectionError",
    "ProjectionSet",
    "ProjectionStore",
    "RecordedEvent",
    "RetryPolicy",
    "RewardAssigned",
    "RowStore",
    "RunStarted",
    "StoreConfig",
    "StoreUnavailable",
    "StreamId",
    "StreamVersionConflict",
    "UnknownEventType",
    "UnknownProjection",
    "WeightsPublished",
    "catch_up",
    "consumption_key",
    "evaluation_projections",
    "iterate",
    "lifecycle_projections",
    "new_outcome",
    "outcome_key",
    "rebuild",
    "subscribe",
]
