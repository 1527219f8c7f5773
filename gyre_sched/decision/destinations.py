"""Where executions go: placement of new starts and reroute destinations.

Both prefer the separate pool, then rollout cells in reverse index order: cells leave
rollout core-first, so the highest index is the destination expected to stay longest,
and an execution is not moved twice within one burst.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gyre_sched.decision.decisions import POOL, Placement


def destination_order(pool_capacity: int, rollout_cells: Iterable[int]) -> list[int]:
    """Engines in preference order: the pool (if any), then rollout cells, highest index first."""
    order = [POOL] if pool_capacity > 0 else []
    order.extend(sorted(rollout_cells, reverse=True))
    return order


def assign(executions: Sequence[int], order: Sequence[int], free: Mapping[int, int]) -> tuple[Placement, ...]:
    """Place ``executions`` in order on the engines of ``order``, filling each up to ``free``.

    Capacity is reserved as it is handed out, so no engine receives more than it has free.
    Returns fewer placements than executions when the engines run out of room.
    """
    placements: list[Placement] = []
    remaining = list(executions)
    for engine in order:
        room = free.get(engine, 0)
        if room <= 0:
            continue
        take, remaining = remaining[:room], remaining[room:]
        placements.extend(Placement(execution, engine) for execution in take)
        if not remaining:
            break
    return tuple(placements)
