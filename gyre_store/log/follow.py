"""Following one run's events: what a long-running component of a run (the launcher, an
evaluator worker) reads the log with.

A ``RunFollower`` reads the event types it follows from its position up to the head, hands
each event of its run, or of one of the run's side runs (``<run>~<name>``, such as held-out
evaluations), to a handler, and waits for the head to move. It keeps no state of its own
beyond the position: what the events mean is the component's. Not here: checkpoints (a
component that restarts reads its run from the start) and projections (``catch_up``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

from gyre_store.log.events import Event
from gyre_store.log.interface import EventLog, read_to_head

SIDE_RUN = "~"  # a side run's id is its run's id, this, and its own name


def base_run(run_id: str) -> str:
    """The run a side run ``<run>~<name>`` belongs to (a run is its own base)."""
    return run_id.split(SIDE_RUN, 1)[0]


def serves(run_id: str, candidate: str) -> bool:
    """Whether a component of ``run_id`` handles ``candidate``'s events: the run itself and
    its side runs."""
    return candidate == run_id or candidate.startswith(run_id + SIDE_RUN)


class RunFollower:
    """Hands the events of ``types`` that belong to ``run_id`` (or its side runs) to ``handle``,
    in log order, with the run each belongs to; an event without a ``run_id`` field belongs to
    no run."""

    def __init__(
        self,
        log: EventLog,
        run_id: str,
        types: Collection[str],
        handle: Callable[[Event, str], None],
    ) -> None:
        self.log = log
        self.run_id = run_id
        self.types = tuple(types)
        self.position = 0  # the head as of the last read: everything up to it is handled
        self._handle = handle

    def read_new(self) -> None:
        """Handle every new event of the run up to the head as of now."""
        events, self.position = read_to_head(self.log, self.position, types=self.types)
        for recorded in events:
            run_id = getattr(recorded.event, "run_id", "")
            if serves(self.run_id, run_id):
                self._handle(recorded.event, run_id)

    def run(self, stop: threading.Event, step: Callable[[], object], poll_s: float) -> None:
        """Call ``step`` (which reads with ``read_new``) until ``stop`` is set, waiting up to
        ``poll_s`` between calls for the log to move past what was read."""
        while not stop.is_set():
            step()
            self.log.wait(self.position, poll_s)
