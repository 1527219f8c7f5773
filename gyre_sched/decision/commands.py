"""The seam between decisions and the machines that carry them out.

``CommandSink`` is what a controller drives: the live one talks to the proxy, engines
and trainers; the simulator's acts on its model of the cluster; ``testing.RecordingSink``
just records. ``carry_out`` turns each decision into sink calls in the paper's order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from gyre_sched.decision.decisions import (
    BeginTransition,
    CoreAtBurstEnd,
    Decision,
    Direction,
    DispatchGroups,
    Placement,
    RequestTick,
    Reroute,
    StartExecutions,
)
from gyre_sched.exceptions import InputOrderError


class CommandSink(Protocol):
    """The actions through which decisions take effect."""

    def dispatch_groups(self, decision: DispatchGroups) -> None:
        """Admit these groups into the rollout queue."""

    def start_executions(self, placements: tuple[Placement, ...]) -> None:
        """Launch these queued executions on these engines."""

    def stop_accepting(self, cell: int) -> None:
        """The cell's engine takes no new requests."""

    def reserve_capacity(self, engine: int, count: int) -> None:
        """Hold ``count`` slots on ``engine`` for executions about to move there."""

    def update_routing(self, moves: tuple[Placement, ...]) -> None:
        """Point the proxy's routes for these executions at their new engines."""

    def cancel_and_retry(self, source: int, moves: tuple[Placement, ...]) -> None:
        """Cancel in-flight requests on ``source``; the proxy retries them on the destination."""

    def release_rollout_memory(self, cell: int) -> None:
        """Offload rollout parameters and free KV cache and scratch buffers."""

    def restore_training_state(self, cell: int) -> None:
        """Restore training parameters and buffers (satellites pull core weights)."""

    def release_training_memory(self, cell: int) -> None:
        """Offload training state before the cell serves rollout again."""

    def restore_rollout_engine(self, cell: int) -> None:
        """Reload rollout weights into the cell's engine and resume serving."""

    def core_decided(self, decision: CoreAtBurstEnd) -> None:
        """Note the end-of-burst decision about the core (it re-shards when it returns)."""

    def schedule_tick(self, wake_at: float) -> None:
        """Deliver a ClockTick at ``wake_at``."""


@runtime_checkable
class KeyedSink(Protocol):
    """A sink whose effects carry idempotency keys: the controller asks it for the view of one
    command (``seq``: the input whose decisions it carries out, ``ordinal``: its place in that
    input's protocol), so that a command repeated after a crash changes nothing."""

    def keyed(self, seq: int, ordinal: int) -> CommandSink:
        """This sink for command ``ordinal`` of input ``seq``."""
        ...


def carry_out(decisions: Iterable[Decision], sink: CommandSink) -> None:
    """Drive ``sink`` through ``decisions`` in order.

    A transition to training is split across its BeginTransition and the Reroute that
    follows: the source stops accepting first, destination capacity is reserved and
    routes updated before anything is cancelled, and memory is released only after.
    """
    pending: BeginTransition | None = None
    for decision in decisions:
        match decision:
            case DispatchGroups():
                sink.dispatch_groups(decision)
            case StartExecutions(placements=placements):
                sink.start_executions(placements)
            case BeginTransition(cell=cell, direction=Direction.TO_TRAIN):
                sink.stop_accepting(cell)
                pending = decision
            case BeginTransition(cell=cell, direction=Direction.TO_ROLLOUT):
                sink.release_training_memory(cell)
                sink.restore_rollout_engine(cell)
            case Reroute(source=source, moves=moves):
                for engine, count in sorted(Counter(m.engine for m in moves).items()):
                    sink.reserve_capacity(engine, count)
                sink.update_routing(moves)
                sink.cancel_and_retry(source, moves)
                sink.release_rollout_memory(source)
                sink.restore_training_state(source)
                pending = None
            case CoreAtBurstEnd():
                sink.core_decided(decision)
            case RequestTick(wake_at=wake_at):
                sink.schedule_tick(wake_at)
    if pending is not None:
        raise InputOrderError(f"transition of cell {pending.cell} to training had no Reroute decision")
