"""``DeadlineTimer``: one event-loop timer for a stream's waits, moved on lazily.

A stream waits many times (for the engine's next chunk, for the answer's next item), each wait
with a deadline. Making a timer for every wait and cancelling it when the wait ends costs a
heap push and a cancelled handle per streamed token; this timer is armed when a wait begins
with none armed (or armed for later than this wait's deadline), and when it fires before the
current wait's deadline (it was armed for an earlier wait) it is moved on to that deadline
rather than made again. A firing between waits lapses; the next wait arms it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# The loop's timers fire to the millisecond: a firing within one of the deadline counts as past.
SLACK_S = 0.001


class DeadlineTimer:
    """Calls ``expired`` once a wait begun with ``waiting`` reaches its deadline before
    ``waited`` ends it. One handle per timer, whatever the number of waits."""

    __slots__ = ("_deadline", "_expired", "_loop", "_timer", "_timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop, expired: Callable[[], None]) -> None:
        self._loop = loop
        self._expired = expired
        self._deadline: float | None = None  # of the wait in progress (the loop's clock)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when the armed timer fires

    def waiting(self, timeout_s: float) -> None:
        """A wait begins that expires ``timeout_s`` from now (unless ``waited`` comes first)."""
        deadline = self._deadline = self._loop.time() + timeout_s
        timer = self._timer
        if timer is not None:
            if self._timer_at <= deadline:
                return  # it fires first and moves itself on to this deadline
            timer.cancel()  # armed for a longer wait than this one
        self._timer, self._timer_at = self._loop.call_at(deadline, self._fired), deadline

    def waited(self) -> None:
        """The wait ended in time; the timer stays armed, for the next wait to reuse."""
        self._deadline = None

    def stop(self) -> None:
        """No more waits: cancel the timer."""
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fired(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return  # between waits; the next wait arms it again
        if self._loop.time() + SLACK_S >= deadline:
            self._deadline = None
            self._expired()
        else:  # armed for an earlier wait: on to this one's deadline
            self._timer, self._timer_at = self._loop.call_at(deadline, self._fired), deadline
