"""The event log: typed events and their registry, the log interface, and its PostgreSQL
implementation (the in-memory one is ``gyre_store.testing``).

Appends are atomic per batch, positions are commit order, a repeated idempotency key is a
no-op. This subpackage knows no event type of a run: those are the catalog's.
"""

from __future__ import annotations

from gyre_store.log.events import (
    REGISTRY,
    AppendResult,
    EncodedEvent,
    Event,
    EventMetadata,
    EventRegistry,
    Limits,
    NewEvent,
    OpaqueEvent,
    RecordedEvent,
    StreamId,
    Upcaster,
)
from gyre_store.log.follow import RunFollower, base_run, serves
from gyre_store.log.interface import EventLog, iterate, read_to_head, subscribe
from gyre_store.log.payload import Payload
from gyre_store.log.postgres import PostgresEventLog

__all__ = [
    "REGISTRY",
    "AppendResult",
    "EncodedEvent",
    "Event",
    "EventLog",
    "EventMetadata",
    "EventRegistry",
    "Limits",
    "NewEvent",
    "OpaqueEvent",
    "Payload",
    "PostgresEventLog",
    "RecordedEvent",
    "RunFollower",
    "StreamId",
    "Upcaster",
    "base_run",
    "iterate",
    "read_to_head",
    "serves",
    "subscribe",
]
