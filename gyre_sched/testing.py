"""In-process stand-ins for tests and examples: a CommandSink that only records.

``RecordingSink`` keeps every call as ``(name, args)`` in order, so a test can assert
the exact command sequence a decision produces, e.g. that routes are updated before
requests are cancelled and memory released last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gyre_sched.decision import CoreAtBurstEnd, DispatchGroups, Placement


@dataclass
class RecordingSink:
    """A CommandSink that records each call and does nothing else."""

    calls: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)

    def names(self) -> list[str]:
        """The method names called, in order."""
        return [name for name, _ in self.calls]

    def dispatch_groups(self, decision: DispatchGroups) -> None:
        self.calls.append(("dispatch_groups", (decision,)))

    def start_executions(self, placements: tuple[Placement, ...]) -> None:
        self.calls.append(("start_executions", (placements,)))

    def stop_accepting(self, cell: int) -> None:
        self.calls.append(("stop_accepting", (cell,)))

    def reserve_capacity(self, engine: int, count: int) -> None:
        self.calls.append(("reserve_capacity", (engine, count)))

    def update_routing(self, moves: tuple[Placement, ...]) -> None:
        self.calls.append(("update_routing", (moves,)))

    def cancel_and_retry(self, source: int, moves: tuple[Placement, ...]) -> None:
        self.calls.append(("cancel_and_retry", (source, moves)))

    def release_rollout_memory(self, cell: int) -> None:
        self.calls.append(("release_rollout_memory", (cell,)))

    def restore_training_state(self, cell: int) -> None:
        self.calls.append(("restore_training_state", (cell,)))

    def release_training_memory(self, cell: int) -> None:
        self.calls.append(("release_training_memory", (cell,)))

    def restore_rollout_engine(self, cell: int) -> None:
        self.calls.append(("restore_rollout_engine", (cell,)))

    def core_decided(self, decision: CoreAtBurstEnd) -> None:
        self.calls.append(("core_decided", (decision,)))

    def schedule_tick(self, wake_at: float) -> None:
        self.calls.append(("schedule_tick", (wake_at,)))
