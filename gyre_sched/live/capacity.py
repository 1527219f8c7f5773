"""C_s from the engines that registered: the rollout pool's capacity as the live controller feeds it.

``RegisteredPool`` follows a run's ``engine.registered`` facts for engines of the separate pool
(``cell_index == -1``; an elastic cell's engine is counted as C_e by the config), each with its
capacity and its newest URL, and asks each engine whether it answers (``answers(url)``: the
caller's probe, e.g. an HTTP GET of the engine's ``/health``; this package does no I/O of its
own) every ``probe_s``. An engine
counts while it answered within ``lost_after_s`` (or registered within it: one that has not been
asked yet); one that stopped answering, its machine lost or cut off, leaves the sum until it
answers or registers again. It probes on a thread of its own, so the controller reads the sum
without waiting (``RegisteredPool()``: None until the first round is done).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gyre_store import catalog
from gyre_store.log import EventLog, iterate

REGISTERED = ("engine.registered",)


@dataclass
class _Engine:
    url: str
    capacity: int
    seen: float  # when this URL was first read (monotonic)
    answered: float | None = None  # the last time it answered (monotonic)


class RegisteredPool:
    """The pool capacity of run ``run_id``: the sum over its registered pool engines that answer."""

    def __init__(
        self,
        log: EventLog,
        run_id: str,
        answers: Callable[[str], bool],
        *,
        probe_s: float = 2.0,
        lost_after_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log, self.run_id = log, run_id
        self.probe_s, self.lost_after_s = probe_s, lost_after_s
        self._answers = answers
        self._clock = clock
        self._engines: dict[str, _Engine] = {}
        self._position = 0
        self._value: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self) -> int | None:
        return self._value

    def start(self) -> RegisteredPool:
        self._thread = threading.Thread(target=self._loop, name="gyre-pool-capacity", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.probe()
            except Exception as exc:  # the store or a probe failed: keep the last sum, try again
                print(f"gyre controller: pool capacity not updated ({exc})", flush=True)
            self._stop.wait(self.probe_s)

    def probe(self) -> int:
        """Read new registrations, ask every engine once, and return (and keep) the sum."""
        now = self._clock()
        for recorded in iterate(self.log, self._position, types=REGISTERED):
            self._position = recorded.position
            event = recorded.event
            if not isinstance(event, catalog.EngineRegistered) or event.run_id != self.run_id:
                continue
            if event.cell_index != -1:
                continue  # an elastic cell's engine: C_e, from the config
            known = self._engines.get(event.engine)
            if known is None or known.url != event.url or known.capacity != event.capacity:
                self._engines[event.engine] = _Engine(event.url, event.capacity, now)
        total = 0
        for engine in self._engines.values():
            if self._answers(engine.url):
                engine.answered = self._clock()
            last = engine.answered if engine.answered is not None else engine.seen
            if self._clock() - last < self.lost_after_s:
                total += engine.capacity
        self._value = total
        return total
