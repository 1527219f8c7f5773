"""``DeadlineTimer``: one timer handle for a stream's waits, on a loop whose clock the test moves."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gyre_proxy.deadline import DeadlineTimer


class Handle:
    def __init__(self, when: float, callback: Any) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Clock:
    """The two loop methods the timer uses, with time moved by ``advance``."""

    def __init__(self) -> None:
        self.now = 100.0
        self.handles: list[Handle] = []
        self.made = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> Handle:
        handle = Handle(when, callback)
        self.made += 1
        self.handles.append(handle)
        return handle

    def advance(self, seconds: float) -> None:
        """Move the clock on, running the handles due by then, as the loop would."""
        self.now += seconds
        while due := [h for h in self.handles if not h.cancelled and h.when <= self.now]:
            for handle in due:
                self.handles.remove(handle)
                handle.callback()

    def armed(self) -> list[float]:
        return [h.when for h in self.handles if not h.cancelled]


def timer() -> tuple[Clock, DeadlineTimer, list[float]]:
    clock = Clock()
    expired: list[float] = []
    return (
        clock,
        DeadlineTimer(cast(asyncio.AbstractEventLoop, clock), lambda: expired.append(clock.now)),
        expired,
    )


def test_a_wait_that_reaches_its_deadline_expires_once() -> None:
    clock, t, expired = timer()
    t.waiting(1.0)
    clock.advance(0.5)
    assert expired == []
    clock.advance(0.6)
    assert expired == [101.1]
    clock.advance(10.0)
    assert expired == [101.1] and clock.armed() == []


def test_waits_ended_in_time_reuse_one_handle_and_never_expire() -> None:
    clock, t, expired = timer()
    for _ in range(50):  # 50 waits of 0.1 s each within a 1 s timeout
        t.waiting(1.0)
        clock.advance(0.1)
        t.waited()
    assert expired == []
    # One handle armed at a time, moved on only when it fired early (about once a second):
    # 50 waits over 5 s made a handful of handles, not one per wait.
    assert len(clock.armed()) == 1 and clock.made <= 6


def test_a_timer_armed_for_an_earlier_wait_moves_on_to_the_current_deadline() -> None:
    clock, t, expired = timer()
    t.waiting(1.0)  # armed for 101.0
    clock.advance(0.9)
    t.waited()
    t.waiting(1.0)  # deadline 101.9; the timer still fires at 101.0
    clock.advance(0.2)  # it fired early: moved on, nothing expired
    assert expired == [] and clock.armed() == [101.9]
    clock.advance(0.8)
    assert expired == [101.9]


def test_a_shorter_wait_after_a_longer_one_arms_the_earlier_deadline() -> None:
    clock, t, expired = timer()
    t.waiting(30.0)
    t.waited()
    t.waiting(0.5)
    assert clock.armed() == [100.5]
    clock.advance(0.5)
    assert expired == [100.5]


def test_a_firing_within_a_millisecond_of_the_deadline_counts_as_past() -> None:
    clock, t, expired = timer()
    t.waiting(1.0)
    clock.handles[0].when = 100.9995  # the loop's timers fire to the millisecond
    clock.advance(0.9995)
    assert expired == [100.9995] and clock.armed() == []


def test_a_firing_between_waits_lapses_and_the_next_wait_arms_again() -> None:
    clock, t, expired = timer()
    t.waiting(1.0)
    t.waited()
    clock.advance(2.0)
    assert expired == [] and clock.armed() == []
    t.waiting(1.0)
    assert clock.armed() == [103.0]


def test_stop_cancels_the_timer() -> None:
    clock, t, expired = timer()
    t.waiting(1.0)
    t.stop()
    assert clock.armed() == []
    clock.advance(5.0)
    assert expired == [] and clock.armed() == []
