"""Where a live run's cell time went, read from its event log: useful work and the rest.

A trainer cell's span runs from ``run.started`` to the run's last ``train.update``; its
useful work is the sum of its ``train.computed`` seconds (pass 1 forwards and pass 2
forward-backwards). The rest is split into update and publication (from the batch's last
computation to its ``train.update``: the reduction, the optimizer step and, for a final
update, saving the policy and every engine loading it, since the core records the update
and ``policy.published`` together once the engines have loaded) and waiting (no micro-step
to compute: the batch's groups were not ready yet, or other cells held the remaining claims).

A rollout engine's span runs from its first ``engine.registered`` to the run's last
``train.update``; it is generating while at least one model call routed to it is open
(the union of the calls' ``[started_at, started_at + duration_s]``, the proxy's own clock).
Of the rest, ``loading weights`` is the update-and-publication time of final updates without
generation (an upper bound: it includes the reduction and the optimizer step) and ``idle`` is
everything else: harnesses running tools, evaluation, and the dispatch boundary.

Times from different machines mix the proxy's clock with the database's ``recorded_at``;
on one machine they agree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

import msgspec

from gyre_store.catalog import (
    EngineRegistered,
    MicroStepComputed,
    ModelCallRecorded,
    RunStarted,
    TrainingUpdate,
)
from gyre_store.log import EventLog

__all__ = ["CellTime", "CellTimeReport", "cell_time"]

_TYPES = (
    "run.started",
    "train.computed",
    "train.update",
    "engine.registered",
    "model_call.recorded",
)


class CellTime(msgspec.Struct, frozen=True, kw_only=True):
    """One cell's span and how it was spent, in seconds (``parts`` sum to ``span_s``)."""

    name: str
    span_s: float
    useful_s: float
    parts: dict[str, float]

    @property
    def fraction(self) -> float | None:
        return self.useful_s / self.span_s if self.span_s > 0 else None


class CellTimeReport(msgspec.Struct, frozen=True, kw_only=True):
    trainers: list[CellTime]
    engines: list[CellTime]

    @staticmethod
    def _pooled(cells: list[CellTime]) -> float | None:
        span = sum(c.span_s for c in cells)
        return sum(c.useful_s for c in cells) / span if span > 0 else None

    @property
    def trainer_fraction(self) -> float | None:
        """Forward-backward seconds over trainer-cell seconds, all trainer cells together."""
        return self._pooled(self.trainers)

    @property
    def engine_fraction(self) -> float | None:
        """Generating seconds over rollout-engine seconds, all engines together."""
        return self._pooled(self.engines)


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two merged interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, high - low)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _clip(intervals: list[tuple[float, float]], low: float, high: float) -> list[tuple[float, float]]:
    return [(max(s, low), min(e, high)) for s, e in intervals if min(e, high) > max(s, low)]


def cell_time(log: EventLog, run_id: str) -> CellTimeReport:
    """How the cells of run ``run_id`` spent their time, as its log records it now."""
    started: float | None = None
    computed: dict[int, float] = defaultdict(float)
    last_computed: dict[int, float] = {}  # batch -> recorded time of its last computation
    updates: list[tuple[float, TrainingUpdate]] = []
    registered: dict[str, float] = {}
    calls: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def ts(at: datetime) -> float:
        return at.timestamp()

    for recorded in log.read(0, types=_TYPES, limit=10_000_000):
        ev = recorded.event
        if getattr(ev, "run_id", None) != run_id:
            continue
        at = ts(recorded.recorded_at)
        match ev:
            case RunStarted() if started is None:
                started = at
            case MicroStepComputed(cell=cell, batch=batch, seconds=seconds):
                computed[cell] += seconds
                last_computed[batch] = max(last_computed.get(batch, at), at)
            case TrainingUpdate():
                updates.append((at, ev))
            case EngineRegistered(engine=engine):
                registered.setdefault(engine, at)
            case ModelCallRecorded(engine=engine) if engine:
                calls[engine].append((ev.started_at, ev.started_at + ev.duration_s))
            case _:
                pass
    if started is None or not updates:
        return CellTimeReport(trainers=[], engines=[])

    # Reduction, update and (for a final update) publication, per batch.
    update_spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    publish: list[tuple[float, float]] = []
    for at, update in updates:
        begin = last_computed.get(update.batch)
        if begin is not None and begin < at:
            for cell in update.cells:
                update_spans[cell].append((begin, at))
            if update.final:
                publish.append((begin, at))
    publish = _union(publish)

    end_train = max(at for at, _ in updates)
    trainers = []
    for cell in sorted(set(computed) | {c for _, u in updates for c in u.cells}):
        span = end_train - started
        useful = min(computed.get(cell, 0.0), span)
        update_s = _length(_union(update_spans.get(cell, [])))
        waiting = max(0.0, span - useful - update_s)
        name = "core" if cell == 0 else f"satellite {cell}"
        trainers.append(
            CellTime(
                name=f"trainer {cell} ({name})",
                span_s=span,
                useful_s=useful,
                parts={"forward-backward": useful, "update + publication": update_s, "waiting": waiting},
            )
        )

    end_run = end_train
    engines = []
    for engine in sorted(registered):
        begin = max(registered[engine], started)
        if begin >= end_run:
            continue
        generating = _clip(_union(calls.get(engine, [])), begin, end_run)
        loads = _clip(publish, begin, end_run)
        span = end_run - begin
        busy = _length(generating)
        loading = _length(loads) - _overlap(loads, generating)
        engines.append(
            CellTime(
                name=f"engine {engine}",
                span_s=span,
                useful_s=busy,
                parts={
                    "generating": busy,
                    "loading weights": loading,
                    "idle": max(0.0, span - busy - loading),
                },
            )
        )
    return CellTimeReport(trainers=trainers, engines=engines)
