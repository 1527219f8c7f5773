"""The live command sink: the decision core's decisions carried out as facts in the log.

Dispatching a group records ``group.dispatched`` (the task it samples, the policy version in
force) and an ``execution.dispatched`` per execution; starting executions records an
``execution.start_requested`` per placement, which the launcher carries out (and whose
``execution.started`` moves the counter p in the world's record).

A role transition's steps become facts for the components that carry them out, in the
paper's order: stopping a cell's engine records ``engine.routing_changed`` (the proxy sends
it nothing new) and a ``cell.command`` for the cell; rerouting records an
``execution.rerouted`` per moved execution (the proxy moves each one, and cancels and
retries its request in flight on the new engine); releasing and restoring memory are
``cell.command`` events the cell runtime carries out in log order, recording each step as
it completes and ``cell.transition_done`` at the end. Reserving destination capacity is the
decision core's own ledger: nothing to carry out. The controller asks for this sink's keyed
view of each command (``keyed``), so every append carries an idempotency key derived from the
command, and a controller that repeats a command after a crash changes nothing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from gyre_sched.decision import CoreAtBurstEnd, DispatchGroups, Placement
from gyre_sched.exceptions import UnkeyedTransitionStep
from gyre_sched.live.events import engine_name, execution_id, group_id
from gyre_store import (
    CellCommand,
    CellStep,
    EngineRoutingChanged,
    EventLog,
    EventMetadata,
    ExecutionDispatched,
    ExecutionRerouted,
    ExecutionStartRequested,
    GroupDispatched,
    NewEvent,
    cell_engine_name,
)
from gyre_store.log import Event


class TaskDeck:
    """Which task each group samples: the run's training tasks, reshuffled every pass.

    Group ``g`` takes the task at ``g mod T`` of the pass ``g div T``'s permutation, drawn
    from ``seed`` and the pass number alone, so any process derives the same assignment.
    """

    def __init__(self, tasks: Sequence[str], seed: int) -> None:
        if not tasks:
            raise ValueError("a run needs at least one training task")
        self._tasks = tuple(tasks)
        self._seed = seed
        self._passes: dict[int, tuple[str, ...]] = {}

    def task_of(self, group: int) -> str:
        n = len(self._tasks)
        pass_, index = divmod(group, n)
        order = self._passes.get(pass_)
        if order is None:
            shuffled = list(self._tasks)
            random.Random(f"{self._seed}/{pass_}").shuffle(shuffled)
            order = self._passes[pass_] = tuple(shuffled)
        return order[index]


class LiveSink:
    """A ``CommandSink`` that records a run's dispatches, start requests and transition steps."""

    def __init__(
        self,
        log: EventLog,
        run_id: str,
        deck: TaskDeck,
        *,
        group_size: int,
        harness: str = "",
        command: tuple[int, int] | None = None,
    ) -> None:
        self.log = log
        self.run_id = run_id
        self.deck = deck
        self.group_size = group_size
        self.harness = harness
        self.command = command  # (seq, ordinal) of the controller's command this view serves
        self._meta = EventMetadata(run_id=run_id)

    def keyed(self, seq: int, ordinal: int) -> LiveSink:
        """This sink for command ``ordinal`` of input ``seq`` (``KeyedSink``)."""
        return LiveSink(
            self.log, self.run_id, self.deck, group_size=self.group_size, harness=self.harness,
            command=(seq, ordinal),
        )  # fmt: skip

    def dispatch_groups(self, decision: DispatchGroups) -> None:
        events: list[NewEvent] = []
        for group in range(decision.first_group, decision.first_group + decision.groups):
            gid = group_id(self.run_id, group)
            dispatched = GroupDispatched(
                group_id=gid,
                run_id=self.run_id,
                query_id=self.deck.task_of(group),
                size=decision.group_size,
                policy_version=decision.version,
            )
            events.append(NewEvent(dispatched, f"dispatch:{gid}", metadata=self._meta))
            for k in range(decision.group_size):
                eid = execution_id(self.run_id, group * decision.group_size + k)
                execution = ExecutionDispatched(
                    execution_id=eid, run_id=self.run_id, group_id=gid, policy_version=decision.version
                )
                events.append(NewEvent(execution, f"dispatch:{eid}", metadata=self._meta))
        self.log.append(events)

    def start_executions(self, placements: tuple[Placement, ...]) -> None:
        events = []
        for placement in placements:
            eid = execution_id(self.run_id, placement.execution)
            request = ExecutionStartRequested(
                execution_id=eid,
                run_id=self.run_id,
                task_id=self.deck.task_of(placement.execution // self.group_size),
                engine=engine_name(placement.engine),
                harness=self.harness,
            )
            events.append(NewEvent(request, f"start:{eid}", metadata=self._meta))
        if events:
            self.log.append(events)

    # -- role transitions ------------------------------------------------------------------------

    def _seq(self, what: str) -> tuple[int, int]:
        if self.command is None:
            raise UnkeyedTransitionStep(
                f"{what}: the live sink carries out transition steps only through keyed(seq, ordinal)"
            )
        return self.command

    def _append(self, what: str, events: Sequence[Event]) -> None:
        seq, ordinal = self._seq(what)
        key = f"sched-cmd:{self.run_id}/{seq}/{ordinal}"
        self.log.append([NewEvent(e, f"{key}/{i}", metadata=self._meta) for i, e in enumerate(events)])

    def _command(self, cell: int, step: CellStep, reason: str = "") -> CellCommand:
        seq, _ = self._seq(f"{step.value} of cell {cell}")
        return CellCommand(run_id=self.run_id, cell_index=cell, step=step, transition=seq, reason=reason)

    def stop_accepting(self, cell: int) -> None:
        engine = cell_engine_name(self.run_id, cell)
        routing = EngineRoutingChanged(engine=engine, accepting=False, reason="cell moves to training")
        self._append("stop accepting", [routing, self._command(cell, CellStep.DRAIN)])

    def reserve_capacity(self, engine: int, count: int) -> None:
        return None  # the decision core's ledger holds the reservation; the controller records the step

    def update_routing(self, moves: tuple[Placement, ...]) -> None:
        rerouted = [
            ExecutionRerouted(
                execution_id=execution_id(self.run_id, m.execution),
                run_id=self.run_id,
                engine=engine_name(m.engine),
            )
            for m in moves
        ]
        if rerouted:
            self._append("update routing", rerouted)

    def cancel_and_retry(self, source: int, moves: tuple[Placement, ...]) -> None:
        self._append(
            "cancel and retry", [self._command(source, CellStep.REROUTE, f"{len(moves)} executions")]
        )

    def release_rollout_memory(self, cell: int) -> None:
        self._append("release rollout memory", [self._command(cell, CellStep.RELEASE)])

    def restore_training_state(self, cell: int) -> None:
        self._append("restore training state", [self._command(cell, CellStep.RESTORE)])

    def release_training_memory(self, cell: int) -> None:
        self._append("release training memory", [self._command(cell, CellStep.RELEASE_TRAINING)])

    def restore_rollout_engine(self, cell: int) -> None:
        self._append("restore rollout engine", [self._command(cell, CellStep.RESTORE_ROLLOUT)])

    def core_decided(self, decision: CoreAtBurstEnd) -> None:
        if decision.stays:  # a core that returns gets its transition's commands instead
            self._append("core decided", [self._command(0, CellStep.CORE_STAYS, "eq. (3) and supply hold")])

    def schedule_tick(self, wake_at: float) -> None:
        return None  # the controller keeps its own wake-ups and feeds the ticks itself
