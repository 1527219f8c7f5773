"""Errors raised by gyre_store.

    GyreStoreError
    ├── ConfigError
    ├── EventValidationError
    │   ├── UnknownEventType
    │   ├── MalformedEvent
    │   └── PayloadTooLarge
    ├── StreamVersionConflict
    ├── StoreUnavailable
    │   └── StoreBusy
    └── ProjectionError
        ├── UnknownProjection
        └── NoTrajectoryTree

Driver errors (psycopg) never leave the package: the adapter translates them into
these with ``raise ... from exc`` so callers handle one tree. ``StoreUnavailable`` (and
its ``StoreBusy``) is about the database, not what was sent: the same call may succeed
later. ``StreamVersionConflict`` says another writer got there first. Any other error
refuses what was sent, and sending the same again fails the same way.
"""

from __future__ import annotations


class GyreStoreError(Exception):
    """The event store failed."""


class ConfigError(GyreStoreError):
    """The store's configuration is invalid."""


class EventValidationError(GyreStoreError):
    """An event was rejected before it reached the database."""


class UnknownEventType(EventValidationError):
    """No event type of that name and schema version is registered."""


class MalformedEvent(EventValidationError):
    """An event body does not match its registered schema."""


class PayloadTooLarge(EventValidationError):
    """An event's body or binary payload is over the configured limit."""


class StreamVersionConflict(GyreStoreError):
    """Another writer appended to the stream first: the expected version is stale."""

    def __init__(self, message: str, *, stream_type: str, stream_id: str, expected: int, actual: int):
        super().__init__(message)
        self.stream_type = stream_type
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual


class StoreUnavailable(GyreStoreError):
    """The database could not be reached, or the connection broke mid-operation."""


class StoreBusy(StoreUnavailable):
    """The database refused the operation for now (a serialization failure, a deadlock, a
    read-only server after a failover, a lock or a resource it lacks); retry it."""


class ProjectionError(GyreStoreError):
    """A projection could not apply an event or be rebuilt."""


class UnknownProjection(ProjectionError):
    """No projection of that name is registered."""


class NoTrajectoryTree(ProjectionError):
    """The execution has no trajectory tree: it recorded no model call."""
