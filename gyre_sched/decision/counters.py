"""The three cumulative counters of the scheduling plane: d, p and f.

d counts dispatched executions, p started ones and f finished ones (completion,
failure, timeout, cancellation, surplus). Queued, running and the waterlevel are
differences of them. Counters are values: every change returns a new object.
"""

from __future__ import annotations

import msgspec

from gyre_sched.exceptions import CounterDecreaseError


class Counters(msgspec.Struct, frozen=True):
    """Cumulative counters d >= p >= f >= 0."""

    d: int = 0
    p: int = 0
    f: int = 0

    @property
    def queued(self) -> int:
        """Dispatched but not started: d - p."""
        return self.d - self.p

    @property
    def running(self) -> int:
        """Started but not finished: p - f."""
        return self.p - self.f

    @property
    def waterlevel(self) -> int:
        """Outstanding rollout work w = d - f (queued plus running)."""
        return self.d - self.f

    def advance(self, *, dispatched: int = 0, started: int = 0, finished: int = 0) -> Counters:
        """Return the counters moved forward by the given steps.

        Raises CounterDecreaseError on a negative step, or when p would pass d or f pass p.
        """
        for name, step in (("d", dispatched), ("p", started), ("f", finished)):
            if step < 0:
                raise CounterDecreaseError(
                    f"counter {name} would decrease by {-step}: counters never decrease"
                )
        new = Counters(self.d + dispatched, self.p + started, self.f + finished)
        if new.p > new.d:
            raise CounterDecreaseError(
                f"p={new.p} would exceed d={new.d}: queued count d - p would go negative"
            )
        if new.f > new.p:
            raise CounterDecreaseError(
                f"f={new.f} would exceed p={new.p}: running count p - f would go negative"
            )
        return new

    def check_successor(self, later: Counters) -> None:
        """Raise CounterDecreaseError if ``later`` has any counter below this one."""
        for name in ("d", "p", "f"):
            before, after = getattr(self, name), getattr(later, name)
            if after < before:
                raise CounterDecreaseError(
                    f"counter {name} went from {before} to {after}: counters never decrease"
                )
