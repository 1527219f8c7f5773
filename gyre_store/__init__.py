"""gyre_store: the event log, typed events, projections and replay of a gyre run.

The log lives in PostgreSQL (``PostgresEventLog``) or in memory (``InMemoryEventLog``);
everything else in gyre reads and writes through these names.
"""

from __future__ import annotations

from . import training_events  # noqa: F401  (registers the train.* event types)
from .catalog import (
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
from .config import RetryPolicy, StoreConfig
from .evaluation import (
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
from .events import (
    AppendResult,
    Event,
    EventMetadata,
    EventRegistry,
    Limits,
    NewEvent,
    RecordedEvent,
    StreamId,
)
from .exceptions import (
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
from .group_projections import (
    EvaluationsProjection,
    GroupsProjection,
    GroupStatus,
    OutcomeStatus,
    evaluation_projections,
)
from .log import EventLog, iterate, subscribe
from .payload import Payload
from .pg_projections import PostgresProjectionStore
from .postgres import PostgresEventLog
from .projections import Projection, ProjectionSet, ProjectionStore, RowStore, catch_up, rebuild
from .run_projections import lifecycle_projections
from .testing import InMemoryEventLog, InMemoryProjectionStore

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
