"""A ``threading.Event`` that signals set, without the deadlock of setting it in the handler.

Python runs a signal handler in the main thread, between two bytecodes of whatever that thread
was doing. ``Event.set()`` takes the event's lock, and ``Event.wait()`` holds that same lock for
a few bytecodes on its way in and out. A handler that calls ``set()`` while the main thread is
inside ``wait()`` therefore waits for a lock its own thread holds: the process hangs for good,
with SIGTERM spent. A serving loop that polls ``stop.wait(0.2)`` meets that window now and then
(a node agent stopped by its run's death hung so; a loop polling ``wait(0)`` hangs on most
signals).

Here the handler only writes a byte to a pipe, which takes no Python lock; a daemon thread
reads the pipe and sets the event from outside the main thread, where waiting for the lock is
harmless.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterable
from types import FrameType, TracebackType

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalStop:
    """``with SignalStop() as stop:`` installs handlers for ``signals`` that set ``stop`` (a
    ``threading.Event``); leaving the block puts the previous handlers back. ``install()`` does
    the same for a process that serves until it ends and never restores them."""

    def __init__(
        self, signals: Iterable[int] = DEFAULT_SIGNALS, event: threading.Event | None = None
    ) -> None:
        self.signals = tuple(signals)
        self.event = event if event is not None else threading.Event()
        self._previous: dict[int, object] = {}  # what signal.signal gave back
        self._write = -1

    def install(self) -> threading.Event:
        read, write = os.pipe()
        os.set_blocking(write, False)  # a burst of signals never blocks the handler
        self._write = write
        threading.Thread(target=self._relay, args=(read,), name="gyre-signal-stop", daemon=True).start()
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self.event

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # A full pipe already carries a byte to the relay; nothing else can go wrong worth raising
        # into whatever the main thread was doing.
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")

    def _relay(self, read: int) -> None:
        try:
            while os.read(read, 64):  # empty: the write end closed, the stop uninstalled
                self.event.set()
        finally:
            os.close(read)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()
        if self._write >= 0:
            os.close(self._write)
            self._write = -1

    def __enter__(self) -> threading.Event:
        return self.install()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()


def until_signal(signals: Iterable[int] = DEFAULT_SIGNALS) -> threading.Event:
    """An event that SIGTERM or SIGINT (or ``signals``) sets, for the rest of the process."""
    return SignalStop(signals).install()
