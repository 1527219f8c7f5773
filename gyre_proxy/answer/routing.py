"""Routing: which engine serves each execution, and where it goes when that one stops.

Each execution sticks to one engine. An execution a run's scheduler placed (its
``execution.started`` names a slot: ``pool`` or ``cell-<i>``) goes to an accepting engine of
that run in that slot; when none is, to another accepting engine of the run, else to one given
on the command line. Engines join
while the proxy serves (a live run's engines register in the log) and leave rollout when the
scheduler says so (``engine.routing_changed``): new requests avoid them and executions bound
to them move, preferring the engine with the fewest executions, so one execution is not
moved again and again. The scheduler moves an execution to another slot by
``execution.rerouted``; the router then tells whoever listens (``on_moved``: the answer
pipeline, which cancels the execution's request in flight and retries it on the new engine)
once the new route is in place, so a cancelled request never comes back to its old engine. An engine that failed a request (its process died, say) is
passed over for ``FAILED_PAUSE_S`` by every execution while another engine accepts, so the
retries go elsewhere instead of back to it; registering again (a restarted engine) clears that.
An execution pinned to one engine (slot ``engine:<name>``: an LLM judge on one of the run's
engines) goes to that engine and to no other.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gyre_proxy.engines import Engine
from gyre_proxy.exceptions import EngineUnavailable
from gyre_store.catalog import EngineRoutingChanged, ExecutionRerouted, ExecutionStarted
from gyre_store.log import RecordedEvent


@dataclass
class RoutedEngine:
    name: str
    engine: Engine
    accepting: bool = True
    run_id: str | None = None  # a live run's engine; None for one given on the command line
    slot: str | None = None  # the scheduler's name for where it serves: "pool" or "cell-<i>"


@dataclass(frozen=True, slots=True)
class Binding:
    """Where a run's scheduler placed an execution (a side run ``<run>~<name>``, such as a
    held-out evaluation, is served by its run's engines)."""

    run_id: str
    slot: str

    @classmethod
    def of(cls, run_id: str, slot: str) -> Binding:
        return cls(run_id.split("~", 1)[0], slot)


FAILED_PAUSE_S = 10.0  # how long an engine that failed a request is passed over
PINNED = "engine:"  # a slot naming one engine of the run: ``engine:<its name in the log>``

Lookup = Callable[[str], Binding | None]
"""Finds an execution's binding that the proxy has not seen yet (reads the log)."""


class Router:
    """A routing table of named engines; thread-safe."""

    def __init__(
        self,
        engines: Iterable[tuple[str, Engine]] = (),
        *,
        lookup: Lookup | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engines = {name: RoutedEngine(name, engine) for name, engine in engines}
        self._sticky: dict[str, str] = {}
        self._failed_until: dict[str, float] = {}  # engine -> when it may be chosen again
        self._clock = clock
        self._bindings: dict[str, Binding | None] = {}
        self._lookup = lookup
        self._lock = threading.Lock()
        self._on_moved: Callable[[str], None] | None = None
        self.moves = 0

    def engines(self) -> list[RoutedEngine]:
        return list(self._engines.values())

    def add(self, name: str, engine: Engine, *, run_id: str | None = None, slot: str | None = None) -> None:
        """Serve ``name`` from now on (replacing an engine of that name, e.g. a restarted one)."""
        with self._lock:
            self._engines[name] = RoutedEngine(name, engine, True, run_id, slot)
            self._failed_until.pop(name, None)

    def on_moved(self, callback: Callable[[str], None] | None) -> None:
        """Call ``callback(execution_id)`` (on the thread that applies routing) whenever an
        execution's binding moves it off the engine it was served by."""
        self._on_moved = callback

    def bind(self, execution_id: str, binding: Binding) -> None:
        """Record where the scheduler placed ``execution_id``; its next request goes there."""
        moved = False
        with self._lock:
            if self._bindings.get(execution_id) != binding:
                self._bindings[execution_id] = binding
                current = self._sticky.get(execution_id)
                if current is not None and not self._fits(self._engines[current], binding):
                    del self._sticky[execution_id]
                    moved = True
        if moved and self._on_moved is not None:
            self._on_moved(execution_id)  # outside the lock: the listener may route again

    def engine_for(self, execution_id: str) -> RoutedEngine:
        """The execution's engine, assigning (or moving it to) an accepting one if needed.

        Raises EngineUnavailable when no engine accepts requests."""
        binding = self._binding(execution_id)
        with self._lock:
            name = self._sticky.get(execution_id)
            if name is not None and name in self._engines and self._engines[name].accepting:
                return self._engines[name]
            chosen = self._choose(binding, exclude=name)
            if name is not None:
                self.moves += 1
            self._sticky[execution_id] = chosen.name
            return chosen

    def _binding(self, execution_id: str) -> Binding | None:
        with self._lock:
            if execution_id in self._bindings or self._lookup is None:
                return self._bindings.get(execution_id)
        found = self._lookup(execution_id)  # outside the lock: it reads the log
        with self._lock:
            return self._bindings.setdefault(execution_id, found)

    @staticmethod
    def _fits(engine: RoutedEngine, binding: Binding) -> bool:
        if binding.slot.startswith(PINNED):
            return engine.run_id == binding.run_id and engine.name == binding.slot.removeprefix(PINNED)
        return engine.run_id == binding.run_id and engine.slot == binding.slot

    def _choose(self, binding: Binding | None, exclude: str | None) -> RoutedEngine:
        load = Counter(self._sticky.values())
        accepting = [e for e in self._engines.values() if e.accepting and e.name != exclude]
        tiers = [accepting]
        if binding is not None and binding.slot.startswith(PINNED):
            tiers = [[e for e in accepting if self._fits(e, binding)]]  # that engine or none
        elif binding is not None:
            # Its slot first, then anywhere in its run, then engines given on the command line;
            # another run's engines never serve it.
            same_run = [e for e in accepting if e.run_id == binding.run_id]
            static = [e for e in accepting if e.run_id is None]
            tiers = [[e for e in same_run if e.slot == binding.slot], same_run, static]
        if not any(tiers):
            if binding is not None and binding.slot.startswith(PINNED):
                raise EngineUnavailable(
                    f"engine {binding.slot.removeprefix(PINNED)!r} of run {binding.run_id!r} is not "
                    "accepting requests (or has not registered)"
                )
            where = f" for run {binding.run_id!r}" if binding is not None else ""
            raise EngineUnavailable(f"no engine is accepting requests{where}")
        now = self._clock()
        # A healthy engine anywhere in the order before a failed one in the preferred tier: the
        # engines of a cell that died (all of them, when its world starts again) must not eat
        # the retries of the executions placed there.
        healthy = [[e for e in tier if self._failed_until.get(e.name, now) <= now] for tier in tiers]
        chosen = next((tier for tier in healthy if tier), None) or next(tier for tier in tiers if tier)
        return min(chosen, key=lambda e: (load[e.name], e.name))

    def set_accepting(self, name: str, accepting: bool) -> None:
        with self._lock:
            if name in self._engines:
                self._engines[name].accepting = accepting

    def mark_failed(self, name: str, execution_id: str) -> None:
        """The engine failed this execution's request: let the next choice move it.

        Never raises: with no other engine the next ``engine_for`` may pick the same one.
        """
        with self._lock:
            self._failed_until[name] = self._clock() + FAILED_PAUSE_S
            if self._sticky.get(execution_id) == name:
                del self._sticky[execution_id]
                self.moves += 1

    def apply(self, event: RecordedEvent) -> None:
        """Follow the log: routing changes and the scheduler's placements."""
        match event.event:
            case EngineRoutingChanged(engine=engine, accepting=accepting):
                self.set_accepting(engine, accepting)
            case ExecutionStarted(execution_id=execution_id, run_id=run_id, engine=slot):
                self.bind(execution_id, Binding.of(run_id, slot))
            case ExecutionRerouted(execution_id=execution_id, run_id=run_id, engine=slot):
                self.bind(execution_id, Binding.of(run_id, slot))
            case _:
                pass
