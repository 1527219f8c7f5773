"""The record spool's files: the journal its records wait in, the dead letters, the answers log.

``SpoolJournal`` is an append-only folder of segment files, one length- and CRC-framed record
after another, locked to one process. A record is framed and written when it is submitted;
segments rotate at ``segment_bytes``, an older one is deleted once every record in it is
written to the store, and the current one carries a written mark (everything before it is in
the store). What a process leaves behind is read back by the next one on the same folder. ``DeadLetters`` keeps each record the store refused for good as one JSON line, and
``AnswerLog`` one JSON line per model-call record the proxy staged. No threads, no store.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from gyre_proxy.exceptions import SpoolInUse
from gyre_store import GyreStoreError, ModelCallRecorded
from gyre_store.log import EventMetadata, EventRegistry, NewEvent, Payload

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")  # frame length, CRC-32 of the frame
_MARK = struct.Struct("<Q")  # a segment's written mark: the offset before which all is written
SEGMENT_PREFIX = "segment-"
SEGMENT_SUFFIX = ".spool"
MARK_SUFFIX = ".written"


class _Frame(msgspec.Struct, array_like=True, frozen=True):
    """A ``NewEvent`` as the journal stores it: the event as its JSON body, the rest as is."""

    event_type: str
    schema_version: int
    body: bytes
    payload: bytes | None
    key: str | None
    event_id: str
    expected_version: int | None
    correlation_id: str | None
    causation_id: str | None
    run_id: str | None
    policy_version: int | None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Frame)
_JSON = msgspec.json.Encoder()


def _uuid(value: str | None) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(value)


def encode_frame(new: NewEvent) -> bytes:
    """``new`` framed for the journal: length and CRC, then the record."""
    event, meta = new.event, new.metadata
    data = _ENCODER.encode(
        _Frame(
            type(event).event_type,
            type(event).schema_version,
            _JSON.encode(event),
            None if new.payload is None else new.payload.encode(),
            new.idempotency_key,
            str(new.event_id),
            new.expected_version,
            None if meta.correlation_id is None else str(meta.correlation_id),
            None if meta.causation_id is None else str(meta.causation_id),
            meta.run_id,
            meta.policy_version,
        )
    )
    return _HEADER.pack(len(data), zlib.crc32(data)) + data


def decode_frame(data: bytes | memoryview, registry: EventRegistry) -> NewEvent:
    """The record of one frame's data (without its header); raises GyreStoreError or
    msgspec.DecodeError when it cannot be read back."""
    f = _DECODER.decode(data)
    return NewEvent(
        registry.from_body(f.event_type, f.schema_version, f.body),
        idempotency_key=f.key,
        payload=None if f.payload is None else Payload.decode(f.payload),
        metadata=EventMetadata(_uuid(f.correlation_id), _uuid(f.causation_id), f.run_id, f.policy_version),
        expected_version=f.expected_version,
        event_id=uuid.UUID(f.event_id),
    )


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Bytes of a segment that did not read back as a record: a frame cut short by a kill
    mid-write (at a segment's end), or damage; kept in ``kept_in``."""

    segment: Path
    offset: int
    size: int
    reason: str
    kept_in: Path


class SpoolJournal:
    """Segment files in ``directory``, written by ``append``, deleted (or marked written) by ``done``.

    The folder is locked (``flock``) while the journal is open; a second process waits up to
    ``lock_wait_s`` for it (a predecessor still writing out its spool) and then raises
    ``SpoolInUse``. ``replayed`` holds what earlier processes left, oldest first, each with its
    segment; they count as pending until ``done``. The folder is tagged with ``store`` (where
    its records go); records an earlier process left for another store are moved to
    ``set_aside``, not replayed. Thread-safe: the spool appends from the
    event loop and its writer syncs and empties from its own thread.
    """

    def __init__(
        self,
        directory: Path,
        registry: EventRegistry,
        *,
        segment_bytes: int = 1 << 20,
        lock_wait_s: float = 60.0,
        store: str = "",
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._segment_bytes = segment_bytes
        self._lock_fd = _lock(directory / "lock", lock_wait_s)
        self.set_aside: Path | None = None
        self._mutex = threading.Lock()
        self._pending: dict[int, int] = {}  # segment -> records in it not yet written
        self._fds: dict[int, int] = {}  # open segments: the current one, and older ones not yet synced
        self._unsynced: set[int] = set()
        self.replayed: list[tuple[NewEvent, int]] = []
        self.unreadable: list[Unreadable] = []
        self.unreadable_records: list[tuple[bytes, Exception]] = []  # framed intact, but not a record
        found = sorted(_segment_number(p) for p in directory.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"))
        tag = directory / "store"
        previous = tag.read_text() if tag.exists() else ""
        if found and store and previous and previous != store:
            # Records for another database are never sent to this one; they are kept, moved aside.
            self.set_aside = directory / f"store-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            self.set_aside.mkdir()
            for number in found:
                for path in (self._path(number), self._mark(number)):
                    if path.exists():
                        path.rename(self.set_aside / path.name)
            tag.rename(self.set_aside / "store")
            found = []
        if store:
            tag.write_text(store)
        for mark in directory.glob(f"{SEGMENT_PREFIX}*{MARK_SUFFIX}"):
            if not mark.with_suffix(SEGMENT_SUFFIX).exists():
                mark.unlink()  # its segment was deleted, and the process died before this
        for number in found:
            self._read(number, registry)
        self._current = (found[-1] + 1) if found else 1
        self._size = 0
        self._mark_fd = -1
        self._open_current()
        self._dir_unsynced = True

    # -- paths and files -------------------------------------------------------------------------
    def _path(self, number: int) -> Path:
        return self.directory / f"{SEGMENT_PREFIX}{number:08d}{SEGMENT_SUFFIX}"

    def _mark(self, number: int) -> Path:
        """Where a segment's written mark is: every frame before that offset is in the store."""
        return self.directory / f"{SEGMENT_PREFIX}{number:08d}{MARK_SUFFIX}"

    def _open_current(self) -> None:
        fd = os.open(self._path(self._current), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._fds[self._current] = fd
        self._pending.setdefault(self._current, 0)
        if self._mark_fd >= 0:
            os.close(self._mark_fd)
        self._mark_fd = os.open(self._mark(self._current), os.O_WRONLY | os.O_CREAT, 0o600)

    def _read(self, number: int, registry: EventRegistry) -> None:
        """Take a left-behind segment's records into ``replayed``; set aside what does not read."""
        path = self._path(number)
        data = path.read_bytes()
        mark = self._mark(number)
        written = (
            _MARK.unpack(mark.read_bytes())[0] if mark.exists() and mark.stat().st_size == _MARK.size else 0
        )
        offset, count = (written if written <= len(data) else 0), 0
        while offset < len(data):
            reason = ""
            if len(data) - offset < _HEADER.size:
                reason = "a frame header cut short"
            else:
                size, crc = _HEADER.unpack_from(data, offset)
                body = data[offset + _HEADER.size : offset + _HEADER.size + size]
                if len(body) < size:
                    reason = f"a frame of {size} bytes cut short at {len(body)}"
                elif zlib.crc32(body) != crc:
                    reason = "a frame whose checksum does not match"
            if reason:
                # A kill mid-write leaves a frame cut short at the end; nothing after it can be
                # framed again. The bytes are kept beside the segment, never dropped.
                kept = path.with_suffix(f".unreadable-{offset}")
                kept.write_bytes(data[offset:])
                self.unreadable.append(Unreadable(path, offset, len(data) - offset, reason, kept))
                with open(path, "r+b") as f:
                    f.truncate(offset)
                    os.fsync(f.fileno())
                break
            try:
                self.replayed.append((decode_frame(body, registry), number))
                count += 1
            except (GyreStoreError, msgspec.DecodeError, ValueError) as exc:
                self.unreadable_records.append((bytes(body), exc))
            offset += _HEADER.size + size
        if count:
            self._pending[number] = count
            with open(path, "rb") as f:
                os.fsync(f.fileno())  # a predecessor may have died before syncing it
        else:
            path.unlink()
            mark.unlink(missing_ok=True)

    # -- the spool's calls -----------------------------------------------------------------------
    def append(self, record: NewEvent) -> int:
        """Write ``record`` to the current segment and return the segment's number.

        Written, not synced: once this returns the record survives the process being killed;
        ``sync`` makes it survive the machine. Raises OSError (the disk full, say); the
        segment is then as it was before the call.
        """
        frame = encode_frame(record)
        with self._mutex:
            if self._size >= self._segment_bytes:
                # A new file, never a truncated one: truncating a file the event loop appends to
                # would make those appends wait on the truncation (a metadata change to journal).
                self._unsynced.add(self._current)  # its fd stays open until it is synced
                self._current += 1
                self._size = 0
                self._open_current()
                self._dir_unsynced = True
            fd = self._fds[self._current]
            try:
                view = memoryview(frame)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self._size)  # no half frame for later ones to follow
                raise
            self._size += len(frame)
            self._pending[self._current] += 1
            self._unsynced.add(self._current)
            return self._current

    def sync(self) -> None:
        """fsync what was appended since the last call (and the folder, when a segment was made)."""
        with self._mutex:
            numbers, self._unsynced = self._unsynced, set()
            fds = [self._fds[n] for n in numbers if n in self._fds]
            sync_dir, self._dir_unsynced = self._dir_unsynced, False
        for fd in fds:
            os.fsync(fd)
        if sync_dir:
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        with self._mutex:  # older segments are closed once synced; their records are on disk
            for number in numbers:
                if number != self._current and number in self._fds and number not in self._unsynced:
                    os.close(self._fds.pop(number))

    def done(self, segments: Iterable[int]) -> None:
        """The records appended to ``segments`` (one number per record) are in the store: an
        older segment with nothing left is deleted, and the current one's written mark moves
        to its end (a later process sends nothing before it)."""
        with self._mutex:
            touched = set()
            for number in segments:
                self._pending[number] -= 1
                touched.add(number)
            for number in touched:
                if self._pending[number]:
                    continue
                if number == self._current:
                    # Not synced: a crash may leave an older mark, and records before the end
                    # are sent again; their keys make that a no-op.
                    os.pwrite(self._mark_fd, _MARK.pack(self._size), 0)
                else:
                    del self._pending[number]
                    self._unsynced.discard(number)
                    fd = self._fds.pop(number, None)
                    if fd is not None:
                        os.close(fd)
                    self._path(number).unlink(missing_ok=True)
                    self._mark(number).unlink(missing_ok=True)

    def close(self) -> None:
        """Close the files and release the folder; records not yet written stay in it."""
        with self._mutex:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            os.close(self._mark_fd)
            os.close(self._lock_fd)


def _segment_number(path: Path) -> int:
    return int(path.name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)])


def _lock(path: Path, wait_s: float) -> int:
    """An exclusive ``flock`` on ``path`` (released when the process ends, however it ends)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_s
    warned = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            if time.monotonic() > deadline:
                os.close(fd)
                raise SpoolInUse(
                    f"the record spool {path.parent} is held by process {holder} (waited {wait_s:.0f} s); "
                    "give each proxy its own spool folder"
                ) from None
            if not warned:
                log.warning(
                    "record spool %s is held by process %s; waiting for it to end", path.parent, holder
                )
                warned = True
            time.sleep(0.1)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


class DeadLetters:
    """Records the store refused for good, one JSON line each in ``path``, synced as written.

    A line holds the record whole (its body as JSON, its binary payload in base64, its key
    and metadata) and the error, so it can be read, fixed and appended again."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, record: NewEvent, error: BaseException) -> None:
        """Keep ``record``; raises OSError when it cannot be written."""
        event, meta = record.event, record.metadata
        self._write(
            {
                "quarantined_at": _now(),
                "error": _error(error),
                "event_type": type(event).event_type,
                "schema_version": type(event).schema_version,
                "stream": str(record.stream),
                "idempotency_key": record.idempotency_key,
                "event_id": str(record.event_id),
                "expected_version": record.expected_version,
                "metadata": {
                    "correlation_id": None if meta.correlation_id is None else str(meta.correlation_id),
                    "causation_id": None if meta.causation_id is None else str(meta.causation_id),
                    "run_id": meta.run_id,
                    "policy_version": meta.policy_version,
                },
                "body": json.loads(_JSON.encode(event)),
                "payload_base64": None
                if record.payload is None
                else base64.b64encode(record.payload.encode()).decode(),
            }
        )

    def add_unreadable(self, frame: bytes, error: BaseException) -> None:
        """Keep a journal frame that did not decode back into a record (base64, as framed)."""
        self._write(
            {
                "quarantined_at": _now(),
                "error": _error(error),
                "frame_base64": base64.b64encode(frame).decode(),
            }
        )

    def _write(self, line: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> list[dict[str, Any]]:
        """Every line kept so far."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]


class AnswerLog:
    """One JSON line per model-call record the proxy staged, appended as it is submitted.

    The pipeline stages a call's record before the harness receives the end of its answer, so
    every answer a harness got (and every cut-short or retried attempt) has its line here, the
    moment the answer ends and whatever happens to the proxy after. Never truncated: it is
    the count to hold the store's records against (execution id and request id, one to one).
    Lines are written, not synced (a machine crash may lose the last ones)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(self, call: ModelCallRecorded) -> None:
        """Append ``call``'s line (one ``write``, so lines of processes sharing the file never mix)."""
        line = {
            "execution_id": call.execution_id,
            "request_id": call.request_id,
            "run_id": call.run_id,
            "finish": str(call.finish),
            "at": _now(),
        }
        os.write(self._fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """The lines of an answers log (none when it does not exist)."""
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]
