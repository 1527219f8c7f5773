"""When a supervised process (a run's child, a node's trainer world) is started again, and
when its supervisor gives up.

A process that dies after running ``healthy_s`` or longer made progress (each recovers its
state from the log), and its death starts the count afresh. One that dies sooner counts as a
death in a row: the n-th waits 2^(n-1) seconds (capped at ``max_pause_s``), so a database
outage of a minute is waited out, and more than ``max_in_a_row`` ends it. Counting restarts
within a fixed minute instead, with pauses that double, never reaches the limit once a start
itself takes seconds: a failure that every start repeats (a record the trainer cannot read,
say) was restarted forever, and the run never ended.
"""

from __future__ import annotations

from dataclasses import dataclass

# The exit code of a supervisor that gave up on what it supervises (a node agent on its trainer
# world): the run ends at once rather than starting it again, which would only repeat that.
GAVE_UP = 3


@dataclass
class RestartPolicy:
    """One supervised process's deaths in a row; ``died`` says how long to wait, or to give up."""

    max_in_a_row: int = 5
    healthy_s: float = 120.0
    max_pause_s: float = 60.0
    in_a_row: int = 0

    def died(self, lived_s: float) -> float | None:
        """The process died after ``lived_s`` seconds: the pause before starting it again, or
        None when it died too often in a row to be started again."""
        if lived_s >= self.healthy_s:
            self.in_a_row = 0
        self.in_a_row += 1
        if self.in_a_row > self.max_in_a_row:
            return None
        return min(2.0 ** (self.in_a_row - 1), self.max_pause_s)
