"""Replay a run's recorded scheduler inputs through a fresh decision core and compare decisions.

``load_run`` reads the ``sched:<run_id>`` stream of any EventLog back into a log of
``LogEntry``; ``replay_run`` feeds its inputs to a new ``DecisionCore``, reports every
decision that differs (empty when identical), runs ``invariants.check_log`` over the
replayed log, and checks that the store's execution lifecycle events agree with the
decisions. It never writes to the log.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from gyre_sched.config import SchedConfig
from gyre_sched.decision import (
    Decision,
    DecisionCore,
    DispatchGroups,
    LogEntry,
    StartExecutions,
    Violation,
    check_log,
)
from gyre_sched.exceptions import InputOrderError, NoRecordedRunError, StoreMappingError
from gyre_sched.live.events import (
    SchedConfigured,
    SchedDecision,
    SchedInput,
    SchedRejected,
    SchedStep,
    engine_name,
    execution_number,
    sched_stream,
)
from gyre_store import catalog, iterate
from gyre_store.log import EventLog


@dataclass(frozen=True)
class RecordedRun:
    """A run's scheduler stream, read back.

    ``entries[i]`` is input ``seq == i`` with its decisions in recorded order;
    ``sources[i]`` the position of the fact it came from (None for a tick);
    ``steps[i]`` how many protocol commands of it were recorded as carried out.
    ``checkpoint`` is the last fact position handled (inputs and rejected facts).
    """

    run_id: str
    config: SchedConfig
    entries: tuple[LogEntry, ...]
    sources: tuple[int | None, ...]
    steps: tuple[int, ...]
    version: int
    checkpoint: int
    orphans: tuple[SchedDecision, ...]  # decisions whose seq names no recorded input


def load_run(log: EventLog, run_id: str) -> RecordedRun:
    """Read ``run_id``'s scheduler stream; raises NoRecordedRunError when it has no config."""
    events = log.read_stream(sched_stream(run_id))
    config: SchedConfig | None = None
    inputs: list[SchedInput] = []
    decisions: dict[int, list[Decision]] = {}
    steps: dict[int, int] = {}
    checkpoint = 0
    for recorded in events:
        ev = recorded.event
        match ev:
            case SchedConfigured():
                config = ev.config
            case SchedInput():
                inputs.append(ev)
                if ev.source_position is not None:
                    checkpoint = max(checkpoint, ev.source_position)
            case SchedDecision():
                decisions.setdefault(ev.seq, []).append(ev.decision)
            case SchedStep():
                steps[ev.seq] = steps.get(ev.seq, 0) + 1
            case SchedRejected():
                checkpoint = max(checkpoint, ev.source_position)
    if config is None:
        raise NoRecordedRunError(f"no scheduler events recorded for run {run_id!r} (no sched.configured)")
    seqs = {ev.seq for ev in inputs}
    orphans = tuple(
        SchedDecision(run_id=run_id, seq=seq, index=i, decision=d)
        for seq, items in sorted(decisions.items())
        if seq not in seqs
        for i, d in enumerate(items)
    )
    return RecordedRun(
        run_id=run_id,
        config=config,
        entries=tuple(LogEntry(ev.input, tuple(decisions.get(ev.seq, ()))) for ev in inputs),
        sources=tuple(ev.source_position for ev in inputs),
        steps=tuple(steps.get(ev.seq, 0) for ev in inputs),
        version=events[-1].stream_version if events else 0,
        checkpoint=checkpoint,
        orphans=orphans,
    )


class DiffKind(enum.Enum):
    """How a recorded decision differs from the replayed one."""

    CHANGED = "changed"  # both exist and differ
    MISSING = "missing"  # replay decided it, the record lacks it
    EXTRA = "extra"  # the record has it, replay did not decide it
    REJECTED = "rejected"  # the fresh decision core refused the recorded input; replay stopped there


class DecisionDiff(msgspec.Struct, frozen=True):
    """One difference between the recorded and the replayed decision sequence."""

    kind: DiffKind
    seq: int
    index: int
    recorded: Decision | None
    replayed: Decision | None
    detail: str = ""


def compare(cfg: SchedConfig, entries: Sequence[LogEntry]) -> tuple[list[LogEntry], list[DecisionDiff]]:
    """Feed ``entries``' inputs to a fresh decision core: the replayed log and every difference."""
    decider = DecisionCore(cfg)
    replayed: list[LogEntry] = []
    diffs: list[DecisionDiff] = []
    for seq, entry in enumerate(entries):
        try:
            decisions = decider.handle(entry.input)
        except InputOrderError as exc:
            diffs.append(DecisionDiff(DiffKind.REJECTED, seq, 0, None, None, str(exc)))
            break
        replayed.append(LogEntry(entry.input, decisions))
        for index in range(max(len(decisions), len(entry.decisions))):
            mine = decisions[index] if index < len(decisions) else None
            theirs = entry.decisions[index] if index < len(entry.decisions) else None
            if mine == theirs:
                continue
            kind = (
                DiffKind.MISSING if theirs is None else DiffKind.EXTRA if mine is None else DiffKind.CHANGED
            )
            diffs.append(DecisionDiff(kind, seq, index, theirs, mine))
    return replayed, diffs


class Disagreement(msgspec.Struct, frozen=True):
    """A store lifecycle event the scheduler's decisions do not account for."""

    position: int
    execution_id: str
    detail: str


_LIFECYCLE = ("execution.dispatched", "execution.started")


def check_lifecycle(log: EventLog, run_id: str, entries: Sequence[LogEntry]) -> list[Disagreement]:
    """Every ExecutionDispatched/ExecutionStarted of ``run_id`` that no decision explains.

    A dispatched execution must lie in a DispatchGroups decision; a started one must have
    been placed by a StartExecutions decision, on the engine named there (its first
    placement: a later reroute moves it without a new start).
    """
    dispatched: set[int] = set()
    first_engine: dict[int, int] = {}
    for entry in entries:
        for decision in entry.decisions:
            if isinstance(decision, DispatchGroups):
                n = decision.group_size
                dispatched.update(
                    range(decision.first_group * n, (decision.first_group + decision.groups) * n)
                )
            elif isinstance(decision, StartExecutions):
                for placement in decision.placements:
                    first_engine.setdefault(placement.execution, placement.engine)
    out: list[Disagreement] = []
    for recorded in iterate(log, types=_LIFECYCLE):
        ev = recorded.event
        if not isinstance(ev, catalog.ExecutionDispatched | catalog.ExecutionStarted) or ev.run_id != run_id:
            continue
        try:
            execution = execution_number(run_id, ev.execution_id)
        except StoreMappingError as exc:
            out.append(Disagreement(recorded.position, ev.execution_id, str(exc)))
            continue
        if isinstance(ev, catalog.ExecutionDispatched):
            if execution not in dispatched:
                out.append(Disagreement(recorded.position, ev.execution_id, "dispatched but no decision did"))
        elif execution not in first_engine:
            out.append(Disagreement(recorded.position, ev.execution_id, "started but no decision placed it"))
        elif ev.engine != engine_name(first_engine[execution]):
            out.append(
                Disagreement(
                    recorded.position,
                    ev.execution_id,
                    f"started on {ev.engine} but placed on {engine_name(first_engine[execution])}",
                )
            )
    return out


class ReplayReport(msgspec.Struct, frozen=True):
    """The outcome of replaying one run."""

    run_id: str
    config: SchedConfig
    inputs: int
    decisions: int
    diffs: tuple[DecisionDiff, ...]
    violations: tuple[Violation, ...]
    lifecycle: tuple[Disagreement, ...]

    @property
    def matched(self) -> bool:
        """The replay reproduced the recorded decision sequence exactly."""
        return not self.diffs

    @property
    def ok(self) -> bool:
        """Matched, no invariant broken, and the store's lifecycle agrees."""
        return self.matched and not self.violations and not self.lifecycle


def replay_run(log: EventLog, run_id: str, *, lifecycle: bool = True) -> ReplayReport:
    """Replay ``run_id`` from ``log``; raises NoRecordedRunError when nothing is recorded."""
    run = load_run(log, run_id)
    replayed, diffs = compare(run.config, run.entries)
    diffs += [
        DecisionDiff(DiffKind.EXTRA, o.seq, o.index, o.decision, None, "no such input") for o in run.orphans
    ]
    return ReplayReport(
        run_id=run_id,
        config=run.config,
        inputs=len(run.entries),
        decisions=sum(len(e.decisions) for e in run.entries),
        diffs=tuple(diffs),
        violations=tuple(check_log(run.config, replayed)),
        lifecycle=tuple(check_lifecycle(log, run_id, replayed)) if lifecycle else (),
    )
