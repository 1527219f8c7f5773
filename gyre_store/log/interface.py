"""The event log interface: append, read in commit order, wait for news, subscribe.

Two implementations pass one shared test suite: ``PostgresEventLog`` (postgres.py) and
``InMemoryEventLog`` (testing.py). Positions are gapless and assigned in commit order, so
"everything after my checkpoint" is always a complete, correctly ordered answer.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from typing import Protocol, runtime_checkable

from gyre_store.log.events import AppendResult, EventRegistry, NewEvent, RecordedEvent, StreamId


@runtime_checkable
class EventLog(Protocol):
    """An append-only, totally ordered log of typed events."""

    @property
    def registry(self) -> EventRegistry: ...

    def append(self, events: Sequence[NewEvent]) -> list[AppendResult]:
        """Append ``events`` atomically, in order; return where each landed.

        Raises EventValidationError before anything is written, StreamVersionConflict when
        an expected version is stale (nothing of the batch is written), StoreUnavailable
        when the database cannot be reached.
        """
        ...

    def read(
        self,
        after: int = 0,
        *,
        limit: int = 1000,
        until: int | None = None,
        types: Collection[str] | None = None,
    ) -> list[RecordedEvent]:
        """Events with ``after < position <= until`` in position (= commit) order."""
        ...

    def read_stream(self, stream: StreamId, *, after_version: int = 0) -> list[RecordedEvent]:
        """One stream's events in version order."""
        ...

    def head(self) -> int:
        """The position of the last committed event (0 for an empty log)."""
        ...

    def wait(self, after: int, timeout: float) -> bool:
        """Block until the head passes ``after`` or ``timeout`` seconds pass; True if it did."""
        ...


def iterate(
    log: EventLog,
    after: int = 0,
    *,
    until: int | None = None,
    types: Collection[str] | None = None,
    batch: int = 1000,
) -> Iterator[RecordedEvent]:
    """Every event after ``after`` (up to ``until``, default the head now), in order."""
    end = log.head() if until is None else until
    while after < end:
        events = log.read(after, limit=batch, until=end, types=types)
        if not events:
            break
        yield from events
        after = events[-1].position


def read_to_head(
    log: EventLog, after: int, *, types: Collection[str] | None = None
) -> tuple[list[RecordedEvent], int]:
    """Every event of ``types`` after position ``after`` up to the log's head as of now, and
    that head: the position a follower that handled them passes back as ``after`` next time
    (every position up to a head read first is committed, so skipping past unmatched ones
    loses nothing)."""
    head = log.head()
    out: list[RecordedEvent] = []
    while after < head:
        batch = log.read(after, until=head, types=types)
        if not batch:
            break
        out.extend(batch)
        after = batch[-1].position
    return out, max(after, head)


def subscribe(
    log: EventLog,
    after: int = 0,
    *,
    types: Collection[str] | None = None,
    batch: int = 1000,
    poll_s: float = 1.0,
    stop_after_idle_s: float | None = None,
    min_interval_s: float = 0.0,
) -> Iterator[list[RecordedEvent]]:
    """Yield batches of new events forever (or until idle for ``stop_after_idle_s``).

    A wake-up only prompts a re-read from the last position seen; the poll timeout covers
    a lost notification. The caller persists the last position it handled and passes it
    back as ``after`` to resume. ``min_interval_s`` spaces the reads: a subscriber to rare
    events in a busy log (every append wakes it) then reads at most once per interval, at
    the cost of seeing its events up to that much later.
    """
    idle_since = time.monotonic()
    read_at = float("-inf")
    while True:
        pause = read_at + min_interval_s - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        read_at = time.monotonic()
        # Read up to a head taken first: every position up to it is committed, so a
        # filtered read that finds nothing may safely move the cursor to it.
        end = log.head()
        events = log.read(after, limit=batch, until=end, types=types)
        if events:
            after = events[-1].position
            idle_since = time.monotonic()
            yield events
            continue
        after = max(after, end)
        if stop_after_idle_s is not None and time.monotonic() - idle_since >= stop_after_idle_s:
            return
        log.wait(after, poll_s)
