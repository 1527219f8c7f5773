"""The live controller: store facts in, decision-core decisions recorded, commands carried out.

``Controller`` subscribes to a run's facts in gyre_store, stamps each as a decision-core input,
appends the input and its decisions (and the cell role changes they imply) in one
atomic append, then drives a ``CommandSink`` through the ordered protocol of
``commands.carry_out``, recording each command as a ``sched.step`` once it returned.
It keeps no state the log does not hold: a new Controller on the same log replays its
recorded inputs, checks it reproduces its recorded decisions, finishes any protocol a
crash interrupted, and continues from the last fact it handled.
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gyre_sched.config import SchedConfig
from gyre_sched.decision import (
    BeginTransition,
    CellRole,
    ClockTick,
    CommandSink,
    CoreAtBurstEnd,
    Decision,
    DecisionCore,
    DecisionState,
    Direction,
    DispatchGroups,
    Input,
    KeyedSink,
    Placement,
    PoolCapacityChanged,
    RequestTick,
    Reroute,
    RunStarted,
    TransitionDone,
    carry_out,
)
from gyre_sched.exceptions import (
    ConfigMismatchError,
    ControllerConflictError,
    InputOrderError,
    NoRecordedRunError,
    ReplayDivergedError,
)
from gyre_sched.live.events import (
    FACT_TYPES,
    ProtocolStep,
    SchedConfigured,
    SchedDecision,
    SchedInput,
    SchedRejected,
    SchedStep,
    config_key,
    decision_key,
    input_key,
    input_of,
    rejected_key,
    role_key,
    step_key,
    store_role,
)
from gyre_sched.live.replay import load_run
from gyre_store import FaultPoint, catalog, iterate, subscribe
from gyre_store.log import EventLog, EventMetadata, NewEvent, RecordedEvent, StreamId

Clock = Callable[[], float]
"""Seconds since the run started; stamps every input the controller makes."""


# -- the ordered protocol, planned before anything is carried out ---------------------------


@dataclass(frozen=True)
class Command:
    """One sink call of the protocol, and what its ``sched.step`` event records."""

    decision: int  # index of the decision (a transition's BeginTransition) it carries out
    step: ProtocolStep
    call: Callable[[CommandSink], None]
    cell: int | None = None
    direction: Direction | None = None
    engine: int | None = None
    count: int = 0


class _Planner:
    """A CommandSink that turns each call into a Command instead of acting."""

    def __init__(self, decision: int, cell: int | None, direction: Direction | None) -> None:
        self.decision, self.cell, self.direction = decision, cell, direction
        self.out: list[Command] = []

    def _add(
        self,
        step: ProtocolStep,
        call: Callable[[CommandSink], None],
        *,
        engine: int | None = None,
        count: int = 0,
    ) -> None:
        self.out.append(Command(self.decision, step, call, self.cell, self.direction, engine, count))

    def dispatch_groups(self, decision: DispatchGroups) -> None:
        count = decision.groups * decision.group_size
        self._add(ProtocolStep.DISPATCH_GROUPS, lambda s: s.dispatch_groups(decision), count=count)

    def start_executions(self, placements: tuple[Placement, ...]) -> None:
        self._add(
            ProtocolStep.START_EXECUTIONS, lambda s: s.start_executions(placements), count=len(placements)
        )

    def stop_accepting(self, cell: int) -> None:
        self._add(ProtocolStep.STOP_ACCEPTING, lambda s: s.stop_accepting(cell))

    def reserve_capacity(self, engine: int, count: int) -> None:
        self._add(
            ProtocolStep.RESERVE_CAPACITY,
            lambda s: s.reserve_capacity(engine, count),
            engine=engine,
            count=count,
        )

    def update_routing(self, moves: tuple[Placement, ...]) -> None:
        self._add(ProtocolStep.UPDATE_ROUTING, lambda s: s.update_routing(moves), count=len(moves))

    def cancel_and_retry(self, source: int, moves: tuple[Placement, ...]) -> None:
        self._add(
            ProtocolStep.CANCEL_AND_RETRY, lambda s: s.cancel_and_retry(source, moves), count=len(moves)
        )

    def release_rollout_memory(self, cell: int) -> None:
        self._add(ProtocolStep.RELEASE_ROLLOUT_MEMORY, lambda s: s.release_rollout_memory(cell))

    def restore_training_state(self, cell: int) -> None:
        self._add(ProtocolStep.RESTORE_TRAINING_STATE, lambda s: s.restore_training_state(cell))

    def release_training_memory(self, cell: int) -> None:
        self._add(ProtocolStep.RELEASE_TRAINING_MEMORY, lambda s: s.release_training_memory(cell))

    def restore_rollout_engine(self, cell: int) -> None:
        self._add(ProtocolStep.RESTORE_ROLLOUT_ENGINE, lambda s: s.restore_rollout_engine(cell))

    def core_decided(self, decision: CoreAtBurstEnd) -> None:
        self._add(ProtocolStep.CORE_DECIDED, lambda s: s.core_decided(decision))

    def schedule_tick(self, wake_at: float) -> None:
        self._add(ProtocolStep.SCHEDULE_TICK, lambda s: s.schedule_tick(wake_at))


def plan_commands(decisions: Sequence[Decision]) -> list[Command]:
    """The sink calls ``decisions`` take, in order, as ``commands.carry_out`` makes them.

    A transition to training is one unit with the Reroute that follows it, so that its
    steps (stop accepting .. restore training state) all name the BeginTransition.
    """
    out: list[Command] = []
    i = 0
    while i < len(decisions):
        decision = decisions[i]
        unit: list[Decision] = [decision]
        cell: int | None = None
        direction: Direction | None = None
        if isinstance(decision, BeginTransition):
            cell, direction = decision.cell, decision.direction
            following = decisions[i + 1] if i + 1 < len(decisions) else None
            if isinstance(following, Reroute) and following.source == decision.cell:
                unit.append(following)
        elif isinstance(decision, Reroute):
            cell, direction = decision.source, Direction.TO_TRAIN
        planner = _Planner(i, cell, direction)
        carry_out(unit, planner)
        out += planner.out
        i += len(unit)
    return out


# -- the controller -------------------------------------------------------------------------


@dataclass(frozen=True)
class ControllerView:
    """What the controller has decided so far, for metrics: the decision core's state, the
    transitions it began by direction, and the inputs it recorded. Published whole after each
    input, so a reader on another thread never sees a replay half done."""

    state: DecisionState
    transitions: dict[Direction, int]
    inputs: int


class Controller:
    """Runs the decision core of run ``run_id`` against ``log``, carrying out through ``sink``.

    ``clock`` gives seconds since the run started (default: wall time since the
    ``run.started`` fact was recorded). Facts are handled in log order; an input is
    stamped ``max(previous input, clock())`` so the decision core sees time move forward.
    Constructing one recovers from the log; it raises ConfigMismatchError,
    ReplayDivergedError, or the store's errors (StoreUnavailable, ...).
    """

    def __init__(
        self,
        log: EventLog,
        cfg: SchedConfig,
        sink: CommandSink,
        run_id: str,
        *,
        clock: Clock | None = None,
        fault: FaultPoint | None = None,
        pool_capacity: Callable[[], int | None] | None = None,
    ) -> None:
        self.log = log
        # C_s now (RegisteredPool: the pool engines that registered and answer), or None while
        # unknown; each change is fed to the decision core as a PoolCapacityChanged input.
        self._pool_capacity = pool_capacity
        self.cfg = cfg.validate()
        self.sink = sink
        self.run_id = run_id
        self.fault = fault  # fault tests: die right after recording a protocol step (gyre_store.faults)
        self._clock = clock
        self._meta = EventMetadata(run_id=run_id)
        self._recover()

    # -- state ------------------------------------------------------------------------------

    @property
    def checkpoint(self) -> int:
        """Position of the last fact handled; facts after it are still to come."""
        return self._checkpoint

    @property
    def inputs_recorded(self) -> int:
        """How many inputs the decision core has been fed in this run (the next ``seq``)."""
        return self._seq

    def state(self) -> DecisionState:
        """The decision core's ledger and roles now."""
        return self._decider.state()

    def view(self) -> ControllerView:
        """The state as of the last input handled; safe to call from any thread."""
        return self._view

    def _publish(self) -> None:
        self._view = ControllerView(self._decider.state(), dict(self._transitions), self._seq)

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        if self._origin is None:
            return self._last_at
        return (datetime.now(UTC) - self._origin).total_seconds()

    def _recover(self) -> None:
        """(Re)build every piece of state from the log: the decision core, the counters, the wakes."""
        self._rebuild()
        self._publish()

    def _rebuild(self) -> None:
        self._decider = DecisionCore(self.cfg)
        self._transitions: Counter[Direction] = Counter()
        self._seq = 0
        self._version = 0
        self._checkpoint = 0
        self._last_at = 0.0
        self._wakes: list[float] = []
        self._stale = False
        self._origin: datetime | None = None
        for recorded in self.log.read_stream(StreamId("run", self.run_id)):
            if isinstance(recorded.event, catalog.RunStarted):
                self._origin = recorded.recorded_at
        try:
            run = load_run(self.log, self.run_id)
        except NoRecordedRunError:
            configured = SchedConfigured(run_id=self.run_id, config=self.cfg)
            self._append_sched([NewEvent(configured, config_key(self.run_id), metadata=self._meta)])
            return
        if run.config != self.cfg:
            raise ConfigMismatchError(
                f"run {self.run_id!r} was recorded with {run.config}, not {self.cfg}: "
                "start the controller with the recorded config"
            )
        self._version = run.version
        self._checkpoint = run.checkpoint
        for seq, entry in enumerate(run.entries):
            try:
                decisions = self._decider.handle(entry.input)
            except InputOrderError as exc:
                raise ReplayDivergedError(f"recorded input {seq} is refused on replay: {exc}") from exc
            if decisions != entry.decisions:
                raise ReplayDivergedError(
                    f"input {seq} ({type(entry.input).__name__}) replays to {len(decisions)} decisions "
                    f"that differ from the {len(entry.decisions)} recorded; was the decision core changed mid-run?"
                )
            self._note(entry.input, decisions)
            self._seq = seq + 1
        for seq, (entry, done) in enumerate(zip(run.entries, run.steps, strict=True)):
            self._carry_out(seq, entry.decisions, first=done)  # finish what a crash cut short

    # -- appends ----------------------------------------------------------------------------

    def _append_sched(self, events: list[NewEvent]) -> None:
        """Append, giving each event on the sched stream its expected version: a second
        controller writing this run fails with StreamVersionConflict instead of interleaving."""
        staged: list[NewEvent] = []
        version = self._version
        for new in events:
            if new.event.stream.type == "sched":
                new = NewEvent(
                    new.event,
                    new.idempotency_key,
                    metadata=new.metadata,
                    expected_version=version,
                    event_id=new.event_id,
                )
                version += 1
            staged.append(new)
        try:
            results = self.log.append(staged)
        except BaseException:
            self._stale = True  # what reached the log is unknown: rebuild from it before going on
            raise
        first = results[0]
        if first.duplicate and self._foreign(first.position, staged[0]):
            # Same idempotency key, another writer's event: we are not alone on this run.
            self._stale = True
            raise ControllerConflictError(
                f"run {self.run_id!r}: {staged[0].idempotency_key} was recorded by another controller"
            )
        self._version = version

    def _foreign(self, position: int, mine: NewEvent) -> bool:
        """Whether the event at ``position`` is not ``mine`` (a retried append finds its own)."""
        found = self.log.read(position - 1, limit=1)
        return not found or found[0].event_id != mine.event_id

    def _note(self, event: Input, decisions: Sequence[Decision]) -> None:
        """Bookkeeping shared by live handling and recovery: time and pending wake-ups."""
        self._last_at = max(self._last_at, event.at)
        if isinstance(event, ClockTick) and self._wakes and self._wakes[0] <= event.at:
            heapq.heappop(self._wakes)
        for decision in decisions:
            if isinstance(decision, RequestTick):
                heapq.heappush(self._wakes, decision.wake_at)
            elif isinstance(decision, BeginTransition):
                self._transitions[decision.direction] += 1

    def _role_changes(
        self, seq: int, event: Input, before: tuple[CellRole, ...], decisions: Sequence[Decision]
    ) -> list[NewEvent]:
        changes: list[tuple[int, catalog.CellRole, catalog.CellRole, str]] = []
        if isinstance(event, RunStarted):
            changes += [
                (cell, store_role(role), catalog.CellRole.ROLLOUT, "fixed partition at run start")
                for cell, role in enumerate(before)
                if role is CellRole.TRAIN
            ]
        if isinstance(event, TransitionDone):
            done = CellRole.TRAIN if before[event.cell] is CellRole.TO_TRAIN else CellRole.ROLLOUT
            changes.append((event.cell, store_role(done), catalog.CellRole.TRANSITIONING, "transition done"))
        for d in decisions:
            if isinstance(d, BeginTransition):
                previous = (
                    catalog.CellRole.ROLLOUT
                    if d.direction is Direction.TO_TRAIN
                    else catalog.CellRole.TRAINING
                )
                why = f"{d.direction.value}: w={d.w} C_R={d.c_r} C_e={d.c_e} k_after={d.k_after}"
                changes.append((d.cell, catalog.CellRole.TRANSITIONING, previous, why))
        nth: Counter[int] = Counter()
        out: list[NewEvent] = []
        for cell, role, previous, reason in changes:
            out.append(
                NewEvent(
                    catalog.CellRoleChanged(
                        run_id=self.run_id, cell_index=cell, role=role, previous=previous, reason=reason
                    ),
                    role_key(self.run_id, seq, cell, nth[cell]),
                    metadata=self._meta,
                )
            )
            nth[cell] += 1
        return out

    # -- handling ---------------------------------------------------------------------------

    def _feed(self, event: Input, source: RecordedEvent | None) -> None:
        before = self._decider.state().roles
        try:
            decisions = self._decider.handle(event)
        except InputOrderError as exc:
            if source is None:
                raise
            # The decision core checks before it changes state, so a refused fact leaves it as it was.
            rejected = SchedRejected(
                run_id=self.run_id, source_position=source.position, input=event, reason=str(exc)
            )
            self._append_sched(
                [NewEvent(rejected, rejected_key(self.run_id, source.position), metadata=self._meta)]
            )
            self._checkpoint = source.position
            self._last_at = max(self._last_at, event.at)
            return
        seq = self._seq
        cause = source.event_id if source is not None else None
        recorded = SchedInput(
            run_id=self.run_id,
            seq=seq,
            input=event,
            source_position=source.position if source is not None else None,
        )
        head = NewEvent(
            recorded,
            input_key(self.run_id, seq),
            metadata=EventMetadata(causation_id=cause, run_id=self.run_id),
        )
        batch = [head]
        for index, decision in enumerate(decisions):
            body = SchedDecision(run_id=self.run_id, seq=seq, index=index, decision=decision)
            meta = EventMetadata(causation_id=head.event_id, run_id=self.run_id)
            batch.append(NewEvent(body, decision_key(self.run_id, seq, index), metadata=meta))
        batch += self._role_changes(seq, event, before, decisions)
        self._append_sched(batch)
        self._seq = seq + 1
        if source is not None:
            self._checkpoint = source.position
        self._note(event, decisions)
        self._publish()
        self._carry_out(seq, decisions, first=0)

    def _carry_out(self, seq: int, decisions: Sequence[Decision], *, first: int) -> None:
        """Carry out the protocol of input ``seq`` from its command ``first`` on; each command
        is recorded after the sink returned (a crash in between repeats it: sinks are
        idempotent per command)."""
        for ordinal, command in enumerate(plan_commands(decisions)):
            if ordinal < first:
                continue
            # A keyed sink gives the command's effects keys of its own, so a command repeated
            # after a crash (done, but not yet recorded as a step) appends nothing new.
            sink = self.sink.keyed(seq, ordinal) if isinstance(self.sink, KeyedSink) else self.sink
            try:
                command.call(sink)
            except BaseException:
                self._stale = True
                raise
            step = SchedStep(
                run_id=self.run_id,
                seq=seq,
                ordinal=ordinal,
                decision=command.decision,
                step=command.step,
                cell=command.cell,
                direction=command.direction,
                engine=command.engine,
                count=command.count,
            )
            self._append_sched([NewEvent(step, step_key(self.run_id, seq, ordinal), metadata=self._meta)])
            if self.fault is not None:
                self.fault.reached(f"controller:{command.step.value}")

    def _handle_fact(self, recorded: RecordedEvent) -> int:
        if recorded.position <= self._checkpoint:
            return 0
        now = self._now()
        fed = self._fire_due(now)
        if isinstance(recorded.event, catalog.RunStarted) and recorded.event.run_id == self.run_id:
            self._origin = self._origin or recorded.recorded_at
        event = input_of(recorded, self.run_id, max(self._last_at, now))
        if event is None:
            self._checkpoint = recorded.position
            return fed
        self._feed(event, recorded)
        return fed + 1

    def _track_capacity(self) -> int:
        """Feed the pool's capacity when it changed (only once the run has started)."""
        if self._pool_capacity is None or not self._decider.started:
            return 0
        capacity = self._pool_capacity()
        if capacity is None or capacity == self._decider.cfg.pool_capacity:
            return 0
        self._feed(PoolCapacityChanged(max(self._last_at, self._now()), capacity), None)
        return 1

    def _fire_due(self, now: float) -> int:
        """Feed a ClockTick for every requested wake-up that ``now`` has reached."""
        fed = 0
        while self._wakes and self._wakes[0] <= now:
            self._feed(ClockTick(max(self._last_at, self._wakes[0])), None)
            fed += 1
        return fed

    # -- entry points -----------------------------------------------------------------------

    def run_once(self) -> int:
        """Handle every fact in the log now, then any wake-up due; return the inputs fed."""
        if self._stale:
            self._recover()
        fed = 0
        for recorded in iterate(self.log, self._checkpoint, types=FACT_TYPES):
            fed += self._handle_fact(recorded)
        return fed + self._fire_due(self._now()) + self._track_capacity()

    def run(self, stop: threading.Event, *, poll_s: float = 1.0) -> None:
        """Follow the log until ``stop`` is set, waking for requested ticks in between."""
        while not stop.is_set():
            if self._stale:
                self._recover()
            wait = poll_s
            if self._wakes:
                wait = min(poll_s, max(0.01, self._wakes[0] - self._now()))
            for batch in subscribe(
                self.log, self._checkpoint, types=FACT_TYPES, poll_s=wait, stop_after_idle_s=wait
            ):
                for recorded in batch:
                    self._handle_fact(recorded)
                self._fire_due(self._now())
                self._track_capacity()
                if stop.is_set():
                    break
            self._fire_due(self._now())
            self._track_capacity()
