"""The record spool: TITO records are written off the response path, in batches.

The proxy stages a record (validated, applied to the execution's in-memory context) and
hands it here; a writer thread appends batches. While the database is unreachable the
records wait in memory, bounded, and are retried with backoff: each carries its
idempotency key, so a batch that did commit before a broken acknowledgement is a no-op
when resent. Only when the spool is full does a submitting request wait.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from types import TracebackType

from gyre_store import EventValidationError, GyreStoreError
from gyre_store.log import NewEvent
from gyre_store.trees import TrajectoryRecorder

log = logging.getLogger(__name__)


class RecordSpool:
    """A bounded queue of staged records and the thread that writes them."""

    def __init__(
        self,
        recorder: TrajectoryRecorder,
        *,
        max_pending: int = 10_000,
        batch: int = 64,
        linger_s: float = 0.02,
        max_backoff_s: float = 2.0,
        on_written: Callable[[str], None] | None = None,
    ) -> None:
        self._recorder = recorder
        self._on_written = on_written  # called with each handled record's stream id
        self._queue: queue.Queue[NewEvent] = queue.Queue(maxsize=max_pending)
        self._batch = batch
        self._linger_s = linger_s
        self._max_backoff_s = max_backoff_s
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._in_flight = 0
        self.written = 0
        self.retries = 0
        self.dropped = 0
        self._by_stream: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name="gyre-record-spool", daemon=True)
        self._thread.start()

    def submit(self, record: NewEvent) -> None:
        """Queue a staged record; blocks only while the spool is full."""
        with self._idle:
            self._in_flight += 1
            self._by_stream[record.stream.id] = self._by_stream.get(record.stream.id, 0) + 1
        self._queue.put(record)

    def pending_for(self, stream_id: str) -> int:
        """Records of stream ``stream_id`` (an execution's calls) not written yet."""
        with self._idle:
            return self._by_stream.get(stream_id, 0)

    @property
    def pending(self) -> int:
        return self._in_flight

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout=timeout)

    def _take(self) -> list[NewEvent]:
        try:
            first = self._queue.get(timeout=0.1)
        except queue.Empty:
            return []
        batch = [first]
        deadline = time.monotonic() + self._linger_s
        while len(batch) < self._batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(self._queue.get(timeout=remaining))
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            batch = self._take()
            if not batch:
                continue
            taken = len(batch)
            handled = list(batch)
            backoff = 0.05
            while batch:
                try:
                    self._recorder.write(batch)
                    break
                except EventValidationError:
                    # Staged records were validated already; if one is refused anyway, find it
                    # alone so the rest of the batch is still written.
                    batch = self._write_one_by_one(batch)
                except GyreStoreError as exc:  # unavailable, read-only after a failover, ...
                    self.retries += 1
                    log.warning("record spool: cannot append (%s); %d records wait", exc, self.pending)
                    if self._stop.wait(backoff):
                        log.error(
                            "record spool closed while appends failed: %d records unwritten", self.pending
                        )
                        return
                    backoff = min(backoff * 2, self._max_backoff_s)
            self.written += taken
            with self._idle:
                self._in_flight -= taken
                for record in handled:
                    left = self._by_stream.get(record.stream.id, 1) - 1
                    if left:
                        self._by_stream[record.stream.id] = left
                    else:
                        self._by_stream.pop(record.stream.id, None)
                    if self._on_written is not None:
                        self._on_written(record.stream.id)
                self._idle.notify_all()

    def _write_one_by_one(self, batch: list[NewEvent]) -> list[NewEvent]:
        """Write what can be written; drop refused records; return the rest on a store error."""
        for i, record in enumerate(batch):
            try:
                self._recorder.write([record])
            except EventValidationError:
                self.dropped += 1
                log.exception("record spool: dropping a refused record of stream %s", record.stream)
                # Later requests of that execution must not match against the lost record.
                self._recorder.forget(record.stream.id)
            except GyreStoreError:
                return batch[i:]
        return []

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (waiting up to ``timeout``), then stop the thread."""
        self.flush(timeout)
        self._stop.set()
        self._thread.join(timeout=5)

    def __enter__(self) -> RecordSpool:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
