"""A log that fails the way a store does, and small records, for the record spool's tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gyre_store import (
    ExecutionStarted,
    GyreStoreError,
    InMemoryEventLog,
    ModelCallRecorded,
    NewEvent,
    Provenance,
    StoreUnavailable,
    TitoArrays,
    new_record,
)
from gyre_store.log import AppendResult


class StoreLog(InMemoryEventLog):
    """An in-memory log that checks events first (as PostgresEventLog does before the database),
    then is ``down`` or refuses the events ``refuse`` picks, as PostgreSQL refuses a NUL in JSON."""

    def __init__(self, refuse: Callable[[NewEvent], bool] = lambda e: False) -> None:
        super().__init__()
        self.down = False
        self.refuse = refuse

    def append(self, events: Sequence[NewEvent]) -> list[AppendResult]:
        for event in events:
            self.registry.encode(event)
        if self.down:
            raise StoreUnavailable("PostgreSQL is unavailable: connection refused")
        if any(self.refuse(e) for e in events):
            raise GyreStoreError("database error (22P05): unsupported Unicode escape sequence")
        return super().append(events)


def started(ex: str, engine: str = "e") -> NewEvent:
    return NewEvent(ExecutionStarted(execution_id=ex, run_id="r", engine=engine), idempotency_key=f"s:{ex}")


def is_bad(event: NewEvent) -> bool:
    return getattr(event.event, "engine", "") == "bad"


def started_ids(log: InMemoryEventLog) -> list[str]:
    return [r.event.execution_id for r in log.read(0) if isinstance(r.event, ExecutionStarted)]


def call(execution_id: str, request_id: str) -> NewEvent:
    """A model-call record of two input and two output tokens."""
    arrays = TitoArrays(
        input_ids=np.array([1, 2], "<i4"), input_prov=np.array([Provenance.SYSTEM] * 2, "|u1"),
        msg_ends=np.zeros(0, "<i4"), msg_hashes=np.zeros(0, "<u4"), output_ids=np.array([7, 8], "<i4"),
        output_logprobs=np.full(2, -0.25, "<f4"), output_prov=np.full(2, Provenance.SAMPLED, "|u1"),
        output_trainable=np.ones(2, np.bool_), output_hash=np.zeros(0, "<u4"),
    )  # fmt: skip
    return new_record(
        ModelCallRecorded(execution_id=execution_id, run_id="run", request_id=request_id), arrays
    )
