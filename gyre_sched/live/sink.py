"""The live command sink: the decision core's decisions carried out as facts in the log.

Dispatching a group records ``group.dispatched`` (the task it samples, the policy version in
force) and an ``execution.dispatched`` per execution; starting executions records an
``execution.start_requested`` per placement, which the launcher carries out (and whose
``execution.started`` moves the counter p in the world's record). Every append carries an
idempotency key, so a controller that repeats a command after a crash changes nothing.

Role transitions (stop accepting, reroute, release and restore memory) are not carried out
on live cells by this sink: they raise ``TransitionNotLive``, so a run whose policy would move
cells stops with that reason instead of pretending. Policies with a fixed partition (Async)
never ask for one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from gyre_sched.decision import CoreAtBurstEnd, DispatchGroups, Placement
from gyre_sched.exceptions import TransitionNotLive
from gyre_sched.live.events import engine_name, execution_id, group_id
from gyre_store import (
    EventLog,
    EventMetadata,
    ExecutionDispatched,
    ExecutionStartRequested,
    GroupDispatched,
    NewEvent,
)


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
    """A ``CommandSink`` that records dispatches and start requests for a run's launcher."""

    def __init__(
        self, log: EventLog, run_id: str, deck: TaskDeck, *, group_size: int, harness: str = ""
    ) -> None:
        self.log = log
        self.run_id = run_id
        self.deck = deck
        self.group_size = group_size
        self.harness = harness
        self._meta = EventMetadata(run_id=run_id)

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

    def core_decided(self, decision: CoreAtBurstEnd) -> None:
        return None  # recorded by the controller as a decision; nothing to carry out here

    def schedule_tick(self, wake_at: float) -> None:
        return None  # the controller keeps its own wake-ups and feeds the ticks itself

    def _transition(self, step: str, cell: int) -> None:
        raise TransitionNotLive(
            f"{step} of cell {cell}: role transitions are not carried out on live cells yet; "
            "run with a fixed partition (policy async)"
        )

    def stop_accepting(self, cell: int) -> None:
        self._transition("stop accepting", cell)

    def reserve_capacity(self, engine: int, count: int) -> None:
        self._transition("reserve capacity", engine)

    def update_routing(self, moves: tuple[Placement, ...]) -> None:
        self._transition("update routing", moves[0].engine if moves else -1)

    def cancel_and_retry(self, source: int, moves: tuple[Placement, ...]) -> None:
        self._transition("cancel and retry", source)

    def release_rollout_memory(self, cell: int) -> None:
        self._transition("release rollout memory", cell)

    def restore_training_state(self, cell: int) -> None:
        self._transition("restore training state", cell)

    def release_training_memory(self, cell: int) -> None:
        self._transition("release training memory", cell)

    def restore_rollout_engine(self, cell: int) -> None:
        self._transition("restore rollout engine", cell)
