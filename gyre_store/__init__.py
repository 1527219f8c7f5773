"""gyre_store: the event log, typed events, projections and replay of a gyre run.

The log lives in PostgreSQL (``PostgresEventLog``) or in memory (``InMemoryEventLog``);
everything else in gyre reads and writes through these names.
"""

from __future__ import annotations

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
    "CellRole",
    "CellRoleChanged",
    "ConfigError",
    "Event",
    "EventLog",
    "EventMetadata",
    "EventRegistry",
    "EventValidationError",
    "ExecutionDispatched",
    "ExecutionFinished",
    "ExecutionStarted",
    "FinishReason",
    "GroupDispatched",
    "GyreStoreError",
    "InMemoryEventLog",
    "InMemoryProjectionStore",
    "Limits",
    "MalformedEvent",
    "NewEvent",
    "Payload",
    "PayloadTooLarge",
    "PostgresEventLog",
    "PostgresProjectionStore",
    "Projection",
    "ProjectionError",
    "ProjectionSet",
    "ProjectionStore",
    "RecordedEvent",
    "RetryPolicy",
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
    "iterate",
    "lifecycle_projections",
    "rebuild",
    "subscribe",
]
