"""Recording model calls into an execution's tree, with the checks the log cannot make.

``TrajectoryRecorder`` keeps, per execution, the length of every record and the message
index (message-chain hash -> where that prefix ends in a stored record) and refuses a
record whose parent is unknown or too short before anything is written. Appends use the
execution's ``calls`` stream version, so two writers cannot interleave unchecked; the
idempotency key makes a retried delivery a no-op.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gyre_store.catalog import HASH_WORDS, ModelCallRecorded, TitoArrays, new_record
from gyre_store.exceptions import MalformedEvent, StreamVersionConflict
from gyre_store.log import AppendResult, EventLog, EventMetadata, NewEvent, StreamId


@dataclass(frozen=True, slots=True)
class PrefixPoint:
    """Where a message prefix ends: in record ``request_id``'s sequence, at ``offset``."""

    request_id: str
    offset: int
    after_output: bool


@dataclass
class ExecutionContext:
    """What is stored of one execution, enough to validate and to match new requests."""

    execution_id: str
    version: int = 0
    lengths: dict[str, int] = field(default_factory=dict)
    index: dict[bytes, PrefixPoint] = field(default_factory=dict)
    first_system_sha: str | None = None

    def apply(self, event: ModelCallRecorded, arrays: TitoArrays) -> None:
        full = event.prefix_len + arrays.input_len + arrays.output_len
        self.lengths[event.request_id] = full
        if self.first_system_sha is None and event.system_sha:
            self.first_system_sha = event.system_sha
        hashes = arrays.msg_hashes.reshape(-1, HASH_WORDS)
        for end, words in zip(arrays.msg_ends.tolist(), hashes, strict=True):
            self.index.setdefault(words.tobytes(), PrefixPoint(event.request_id, int(end), False))
        if event.context_hash:
            input_end = event.prefix_len + arrays.input_len
            self.index.setdefault(
                bytes.fromhex(event.context_hash), PrefixPoint(event.request_id, input_end, False)
            )
        if arrays.output_hash.shape[0]:
            self.index.setdefault(arrays.output_hash.tobytes(), PrefixPoint(event.request_id, full, True))

    def check(self, event: ModelCallRecorded, arrays: TitoArrays) -> None:
        where = f"record {event.request_id} of execution {event.execution_id}"
        if event.prefix_of is not None:
            parent = self.lengths.get(event.prefix_of)
            if parent is None:
                raise MalformedEvent(f"{where}: its parent record {event.prefix_of!r} does not exist")
            if event.prefix_len > parent:
                raise MalformedEvent(
                    f"{where}: shares {event.prefix_len} tokens with {event.prefix_of!r}, which has only {parent}"
                )
        if event.retry_of is not None and event.retry_of not in self.lengths:
            raise MalformedEvent(f"{where}: retries unknown record {event.retry_of!r}")


class TrajectoryRecorder:
    """Validated, idempotent appends of TITO records; thread-safe."""

    def __init__(self, log: EventLog) -> None:
        self._log = log
        self._contexts: dict[str, ExecutionContext] = {}
        self._lock = threading.Lock()

    @property
    def log(self) -> EventLog:
        return self._log

    def forget(self, execution_id: str) -> None:
        """Drop the cached context of an execution; it is reloaded from the log when next used."""
        with self._lock:
            self._contexts.pop(execution_id, None)

    def context(self, execution_id: str) -> ExecutionContext:
        """The execution's stored state, loaded from the log on first use."""
        with self._lock:
            ctx = self._contexts.get(execution_id)
            if ctx is None:
                ctx = self._load(execution_id)
                self._contexts[execution_id] = ctx
            return ctx

    def cached_context(self, execution_id: str) -> ExecutionContext | None:
        """The execution's state if it is in memory now; None where ``context`` would read the log."""
        with self._lock:
            return self._contexts.get(execution_id)

    def _load(self, execution_id: str) -> ExecutionContext:
        ctx = ExecutionContext(execution_id)
        for ev in self._log.read_stream(StreamId("calls", execution_id)):
            assert isinstance(ev.event, ModelCallRecorded)
            ctx.apply(ev.event, TitoArrays.from_payload(ev.payload))
            ctx.version = ev.stream_version
        return ctx

    def stage(
        self, event: ModelCallRecorded, arrays: TitoArrays, metadata: EventMetadata | None = None
    ) -> NewEvent:
        """Validate a record and apply it to the in-memory context now; append it later.

        For writers that take appends off the response path (the proxy's spool): the next
        request of the execution already matches against this record. Appending the returned
        event (``write``) is idempotent, so a spool may retry it until the database answers.
        """
        with self._lock:
            ctx = self._contexts.get(event.execution_id)
            if ctx is None:
                ctx = self._load(event.execution_id)
                self._contexts[event.execution_id] = ctx
            if event.request_id not in ctx.lengths:
                ctx.check(event, arrays)
                record = new_record(event, arrays, metadata=metadata)
                ctx.apply(event, arrays)
                return record
            return new_record(event, arrays, metadata=metadata)

    def write(self, records: Sequence[NewEvent]) -> list[AppendResult]:
        """Append staged records (in order); raises StoreUnavailable while the database is down."""
        return self._log.append(records)

    def record(
        self, event: ModelCallRecorded, arrays: TitoArrays, metadata: EventMetadata | None = None
    ) -> AppendResult:
        return self.record_many([(event, arrays, metadata)])[0]

    def record_many(
        self, batch: Sequence[tuple[ModelCallRecorded, TitoArrays, EventMetadata | None]]
    ) -> list[AppendResult]:
        """Append records in order (of one or several executions), atomically."""
        for attempt in range(3):
            with self._lock:
                contexts: dict[str, ExecutionContext] = {}
                staged: dict[str, ExecutionContext] = {}
                new: list[NewEvent] = []
                checked: set[str] = set()  # executions whose stream version is already pinned
                for event, arrays, metadata in batch:
                    ex = event.execution_id
                    if ex not in contexts:
                        ctx = self._contexts.get(ex) or self._load(ex)
                        contexts[ex] = ctx
                        staged[ex] = ExecutionContext(
                            ex, ctx.version, dict(ctx.lengths), dict(ctx.index), ctx.first_system_sha
                        )
                    view = staged[ex]
                    duplicate = event.request_id in view.lengths
                    if not duplicate:
                        view.check(event, arrays)
                    record = new_record(event, arrays, metadata=metadata)
                    first_of_stream = ex not in checked
                    if first_of_stream and not duplicate:
                        checked.add(ex)
                        # The stream must be where we validated it; later ones follow in order.
                        record = replace(record, expected_version=view.version)
                    new.append(record)
                    if not duplicate:
                        view.apply(event, arrays)
                try:
                    results = self._log.append(new)
                except StreamVersionConflict:
                    # Another writer got there first: reload those executions and re-check.
                    for ex in contexts:
                        self._contexts.pop(ex, None)
                    if attempt == 2:
                        raise
                    continue
                for ex, view in staged.items():
                    view.version += sum(
                        1 for r, n in zip(results, new, strict=True) if not r.duplicate and n.stream.id == ex
                    )
                    self._contexts[ex] = view
                return results
        raise AssertionError("unreachable")
