"""Routing: which engine serves each execution, and where it goes when that one stops.

Each execution sticks to one engine. When the scheduler takes an engine out of rollout
(an ``engine.routing_changed`` event), new requests avoid it and executions bound to it
move; the choice prefers the engine with the fewest executions, so one execution is not
moved again and again. In-flight requests on a stopped engine are cancelled and retried
by the answer pipeline, not here.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from gyre_proxy.engines import Engine
from gyre_proxy.exceptions import EngineUnavailable
from gyre_store.catalog import EngineRoutingChanged
from gyre_store.log import RecordedEvent


@dataclass
class RoutedEngine:
    name: str
    engine: Engine
    accepting: bool = True


class Router:
    """A routing table of named engines; thread-safe."""

    def __init__(self, engines: Iterable[tuple[str, Engine]]) -> None:
        self._engines = {name: RoutedEngine(name, engine) for name, engine in engines}
        if not self._engines:
            raise EngineUnavailable("the proxy needs at least one engine")
        self._sticky: dict[str, str] = {}
        self._lock = threading.Lock()
        self.moves = 0

    def engines(self) -> list[RoutedEngine]:
        return list(self._engines.values())

    def engine_for(self, execution_id: str) -> RoutedEngine:
        """The execution's engine, assigning (or moving it to) an accepting one if needed."""
        with self._lock:
            name = self._sticky.get(execution_id)
            if name is not None and self._engines[name].accepting:
                return self._engines[name]
            chosen = self._least_loaded(exclude=name)
            if name is not None:
                self.moves += 1
            self._sticky[execution_id] = chosen.name
            return chosen

    def _least_loaded(self, exclude: str | None = None) -> RoutedEngine:
        load = Counter(self._sticky.values())
        candidates = [e for e in self._engines.values() if e.accepting and e.name != exclude]
        if not candidates:
            raise EngineUnavailable("no engine is accepting requests")
        return min(candidates, key=lambda e: (load[e.name], e.name))

    def set_accepting(self, name: str, accepting: bool) -> None:
        with self._lock:
            if name in self._engines:
                self._engines[name].accepting = accepting

    def mark_failed(self, name: str, execution_id: str) -> None:
        """The engine failed this execution's request: let the next choice move it.

        Never raises: with no other engine the next ``engine_for`` may pick the same one.
        """
        with self._lock:
            if self._sticky.get(execution_id) == name:
                del self._sticky[execution_id]
                self.moves += 1

    def apply(self, event: RecordedEvent) -> None:
        """Follow the scheduler: apply an ``engine.routing_changed`` event."""
        if isinstance(event.event, EngineRoutingChanged):
            self.set_accepting(event.event.engine, event.event.accepting)
