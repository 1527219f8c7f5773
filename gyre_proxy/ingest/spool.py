"""The record spool: TITO records are written off the response path, in batches.

The proxy stages a record (validated, applied to the execution's in-memory context) and
hands it here; a writer thread appends batches. A store error is either transient (the
database away or busy, a stream-version race: ``RETRIED``), and the batch is retried with
backoff while later records wait behind it, or it refuses the record for good: that record
is quarantined (a line of ``dead-letter.jsonl``, a ``record.quarantined`` event once the
store takes one, an error logged) and the spool goes on with the rest. Each record carries
its idempotency key, so a batch that did commit before a broken acknowledgement is a no-op
when resent. Only when the spool is full does a submitting request wait.

With a ``directory``, records also wait on disk (``spool_files.SpoolJournal``): ``submit``
writes each one to the journal before it returns, and the pipeline submits a call's record
before the harness receives the end of its answer, so an answer a harness has is never only
in this process's memory: killed, the next proxy on the folder sends what it left. The
writer fsyncs each batch before appending it (one fsync per batch, on its thread, never on
the event loop): an fsync per record, before the answer's end, would put a disk flush on the
event loop for every answer, and a machine crash (not a process's) is the only thing it would
add cover for; that window is at most one batch's linger. Without a directory (tests,
in-process proxies) records wait in memory and are lost if the process dies.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import msgspec

from gyre_proxy.exceptions import SpoolClosed
from gyre_proxy.ingest.spool_files import AnswerLog, DeadLetters, SpoolJournal
from gyre_store import ModelCallRecorded, RecordQuarantined, StoreUnavailable, StreamVersionConflict
from gyre_store.log import NewEvent
from gyre_store.trees import TrajectoryRecorder

log = logging.getLogger(__name__)

# Retried until written. StoreBusy is a StoreUnavailable. A version conflict on records that
# carry no expected version is two writers racing for the stream's next slot: a retry takes
# the next one. Anything else refuses the record itself, and resending it fails the same way.
RETRIED = (StoreUnavailable, StreamVersionConflict)
DEAD_LETTERS = "dead-letter.jsonl"


@dataclass(slots=True)
class _Item:
    record: NewEvent
    segment: int  # its journal segment; -1 when it waits in memory only
    note: bool = False  # the spool's own record.quarantined event: no request staged it


class RecordSpool:
    """A bounded queue of staged records, the thread that writes them, and (with a
    ``directory``) the journal they wait in; see the module docstring."""

    def __init__(
        self,
        recorder: TrajectoryRecorder,
        *,
        directory: Path | None = None,
        answers_log: Path | None = None,
        max_pending: int = 10_000,
        batch: int = 64,
        linger_s: float = 0.02,
        max_backoff_s: float = 2.0,
        segment_bytes: int = 1 << 20,
        lock_wait_s: float = 60.0,
        store: str = "",
        on_written: Callable[[str], None] | None = None,
        on_replayed: Callable[[str], None] | None = None,
    ) -> None:
        self._recorder = recorder
        self._on_written = on_written  # called with each handled record's stream id
        self._batch = batch
        self._linger_s = linger_s
        self._max_backoff_s = max_backoff_s
        self._stop = threading.Event()
        self._closed = False
        self._idle = threading.Condition()
        self._in_flight = 0
        self.written = 0
        self.retries = 0
        self.quarantined = 0  # refused for good, kept in the dead letters
        self.lost = 0  # neither written nor kept anywhere; each one is logged as an error
        self.journal_failures = 0  # records (or answers-log lines) the disk did not take
        self._by_stream: dict[str, int] = {}
        self._notes: deque[_Item] = deque()  # record.quarantined events, written by the writer
        self.directory = directory
        self._journal: SpoolJournal | None = None
        self._dead: DeadLetters | None = None
        if directory is not None:
            self._journal = SpoolJournal(
                directory,
                recorder.log.registry,
                segment_bytes=segment_bytes,
                lock_wait_s=lock_wait_s,
                store=store,
            )
            self._dead = DeadLetters(directory / DEAD_LETTERS)
        self._answers = None if answers_log is None else AnswerLog(answers_log)
        self.replayed = 0 if self._journal is None else len(self._journal.replayed)
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=max_pending + self.replayed)
        if self._journal is not None and self._dead is not None:
            self._take_over(self._journal, self._dead, on_replayed)
        self._thread = threading.Thread(target=self._run, name="gyre-record-spool", daemon=True)
        self._thread.start()

    def _take_over(
        self, journal: SpoolJournal, dead: DeadLetters, on_replayed: Callable[[str], None] | None
    ) -> None:
        """Queue what an earlier process left in the journal, ahead of anything new."""
        if journal.set_aside is not None:
            log.error(
                "record spool: %s held records for another store than this proxy's; they are moved "
                "to %s, not sent here", journal.directory, journal.set_aside,
            )  # fmt: skip
        for piece in journal.unreadable:
            log.warning(
                "record spool: %d bytes at %d of %s do not read back (%s; a process killed while "
                "writing leaves one cut short at the end); kept in %s",
                piece.size, piece.offset, piece.segment, piece.reason, piece.kept_in,
            )  # fmt: skip
        for frame, error in journal.unreadable_records:
            try:
                dead.add_unreadable(frame, error)
            except OSError as exc:
                self.lost += 1
                log.error(
                    "record spool: a journal record does not decode (%s), nor can it be kept: %s", error, exc
                )
                continue
            self.quarantined += 1
            log.error("record spool: a journal record does not decode (%s); kept in %s", error, dead.path)
        for record, segment in journal.replayed:
            self._count_in(record)
            self._queue.put_nowait(_Item(record, segment))
            if on_replayed is not None:
                on_replayed(record.stream.id)
        if journal.replayed:
            log.warning(
                "record spool: %d records an earlier process left in %s are sent again",
                len(journal.replayed), journal.directory,
            )  # fmt: skip

    def _count_in(self, record: NewEvent) -> None:
        with self._idle:
            self._in_flight += 1
            self._by_stream[record.stream.id] = self._by_stream.get(record.stream.id, 0) + 1

    def submit(self, record: NewEvent) -> None:
        """Queue a staged record, in the journal first; blocks only while the spool is full.

        Raises SpoolClosed once the spool is closed (the record would never be written)."""
        if self._closed:
            raise SpoolClosed(f"record spool closed: {record.stream} {record.idempotency_key} not taken")
        segment = -1
        if self._journal is not None:
            try:
                segment = self._journal.append(record)
            except (OSError, msgspec.EncodeError, TypeError) as exc:  # the disk, or a record that
                # does not encode (the writer's checks will refuse it too): the answer goes on
                self.journal_failures += 1
                log.error(
                    "record spool: cannot write %s to the journal (%s); it waits in memory only, "
                    "lost if this process dies before the store takes it", record.idempotency_key, exc,
                )  # fmt: skip
        if self._answers is not None and isinstance(record.event, ModelCallRecorded):
            try:
                self._answers.note(record.event)
            except OSError as exc:
                self.journal_failures += 1
                log.error(
                    "record spool: cannot write the answers log line of %s (%s)", record.idempotency_key, exc
                )
        self._count_in(record)
        self._queue.put(_Item(record, segment))

    def pending_for(self, stream_id: str) -> int:
        """Records of stream ``stream_id`` (an execution's calls) not written yet."""
        with self._idle:
            return self._by_stream.get(stream_id, 0)

    @property
    def pending(self) -> int:
        return self._in_flight

    def stats(self) -> dict[str, int]:
        """The spool's counters, for logs and the proxy's /health."""
        return {
            "pending": self.pending,
            "written": self.written,
            "retries": self.retries,
            "replayed": self.replayed,
            "quarantined": self.quarantined,
            "lost": self.lost,
            "journal_failures": self.journal_failures,
        }

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout=timeout)

    # -- the writer thread -----------------------------------------------------------------------
    def _take(self) -> list[_Item]:
        if self._notes:
            return [self._notes.popleft() for _ in range(min(len(self._notes), self._batch))]
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
        while not (self._stop.is_set() and self._queue.empty() and not self._notes):
            batch = self._take()
            if not batch:
                continue
            if self._journal is not None:
                try:
                    self._journal.sync()
                except OSError as exc:
                    log.error("record spool: cannot sync the journal (%s); a machine crash may lose it", exc)
            if not self._write(batch):
                self._abandon()
                return
            if self._journal is not None:  # before the count drops: a flush sees the files as left
                try:
                    self._journal.done(item.segment for item in batch if item.segment >= 0)
                except OSError as exc:  # they are written; a later process would send them again, as no-ops
                    log.error("record spool: cannot mark written records in the journal (%s)", exc)
            with self._idle:
                self._in_flight -= len(batch)
                for item in batch:
                    if item.note:
                        continue
                    stream = item.record.stream.id
                    left = self._by_stream.get(stream, 1) - 1
                    if left:
                        self._by_stream[stream] = left
                    else:
                        self._by_stream.pop(stream, None)
                    if self._on_written is not None:
                        self._on_written(stream)
                self._idle.notify_all()

    def _write(self, items: list[_Item]) -> bool:
        """Write ``items`` in order, quarantining the ones refused; False if the spool was
        closed while the store was away (they are not written)."""
        backoff = 0.05
        while items:
            try:
                self._recorder.write([item.record for item in items])
                self.written += sum(1 for item in items if not item.note)
                return True
            except RETRIED as exc:  # unavailable, busy (read-only after a failover, ...)
                transient: Exception = exc
            except Exception as exc:  # refused: by the store, or by the checks before it
                if len(items) == 1:
                    self._quarantine(items[0], exc)
                    return True
                items, stopped = self._isolate(items)
                if stopped is None:
                    return True
                transient = stopped
            self.retries += 1
            log.warning("record spool: cannot append (%s); %d records wait", transient, self.pending)
            if self._stop.wait(backoff):
                return False
            backoff = min(backoff * 2, self._max_backoff_s)
        return True

    def _isolate(self, items: list[_Item]) -> tuple[list[_Item], Exception | None]:
        """Write one at a time to find the refused ones; those behind them are written still.
        Stops at a transient error, returning the rest (in order: a record never goes in ahead
        of one before it) and that error."""
        for i, item in enumerate(items):
            try:
                self._recorder.write([item.record])
                self.written += not item.note
            except RETRIED as exc:
                return items[i:], exc
            except Exception as exc:
                self._quarantine(item, exc)
        return [], None

    def _quarantine(self, item: _Item, error: Exception) -> None:
        """Set a refused record aside: in the dead letters, with a note for the store."""
        record = item.record
        where = f"{type(record.event).event_type} {record.stream} (key {record.idempotency_key})"
        if item.note:
            # Its record is in the dead letters already; only this note of it is lost.
            self.lost += 1
            log.error(
                "record spool: the store refused the note of a quarantined record, %s: %s", where, error
            )
            return
        kept = ""
        if self._dead is not None:
            try:
                self._dead.add(record, error)
                kept = str(self._dead.path)
            except OSError as exc:
                log.error("record spool: cannot write the dead letter of %s: %s", where, exc)
        if kept:
            self.quarantined += 1
            log.error(
                "record spool: the store refused %s for good (%s); set aside in %s, the records behind it go on",
                where, error, kept, exc_info=error,
            )  # fmt: skip
        else:
            self.lost += 1
            log.error(
                "record spool: the store refused %s for good (%s); it is lost", where, error, exc_info=error
            )
        # Later requests of that execution must not match against the record the store lacks.
        self._recorder.forget(record.stream.id)
        note = NewEvent(
            RecordQuarantined(
                record_stream=str(record.stream), record_type=type(record.event).event_type,
                record_id=str(record.event_id), record_key=record.idempotency_key or "",
                run_id=record.metadata.run_id or getattr(record.event, "run_id", None),
                error=f"{type(error).__name__}: {error}"[:2000], dead_letter=kept, host=socket.gethostname(),
            ),
            idempotency_key=f"quarantined:{record.event_id}",
        )  # fmt: skip
        segment = -1
        if self._journal is not None:
            try:
                segment = self._journal.append(note)
            except OSError as exc:
                self.journal_failures += 1
                log.error("record spool: cannot write the quarantine note to the journal (%s)", exc)
        with self._idle:
            self._in_flight += 1
        self._notes.append(_Item(note, segment, note=True))

    def _abandon(self) -> None:
        """The spool was closed while the store was away: say what becomes of what is left."""
        left = self.pending
        if self._journal is not None:
            log.warning(
                "record spool closed while appends failed: %d records stay in %s and are sent "
                "when a proxy starts on it again", left, self._journal.directory,
            )  # fmt: skip
        else:
            self.lost += left
            log.error("record spool closed while appends failed: %d records unwritten and lost", left)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (waiting up to ``timeout``), then stop the thread."""
        self.flush(timeout)
        self._closed = True
        self._stop.set()
        self._thread.join(timeout=5)
        if self._thread.is_alive():
            # Inside an append that is still retrying: its files stay open for it; what it
            # has not written stays in the journal (or, without one, is lost with the process).
            log.warning("record spool: the writer is still appending at close; %d records wait", self.pending)
            return
        if self._journal is not None:
            self._journal.close()
        if self._answers is not None:
            self._answers.close()

    def __enter__(self) -> RecordSpool:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
