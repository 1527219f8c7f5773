"""Who reduces a batch: the pure decision the core makes once every gradient task is handed out.

Cells join a batch in index order and form a prefix 0..k-1 (the core is cell 0). When the core
finds nothing left to claim it closes the join window and calls `plan_reduction` with what the
board and the queue say (members, heartbeats, drained reports, pending claims). The answer is to wait, to take over
claims of cells outside the live prefix, or a `ReducePlan`: the prefix that reduces and which
micro-steps each member holds, each micro-step exactly once. No I/O, no torch here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from gyre_train.cells.claims import PendingClaim
from gyre_train.exceptions import ContributionError

CORE = 0


class ReducePlan(msgspec.Struct, frozen=True, array_like=True):
    """The reduction of one batch: cells 0..k-1 reduce onto the core, then one update.

    `held[i]` lists (message id, micro-step index) of what `cells[i]` holds; `dropped` cells are
    alive but outside the prefix and must discard their gradients; `final` says whether this is
    the burst's last update (publish to engines) or not (broadcast to `cells`). `attempt` counts
    the batch's plans: a member dying inside the reduction fails it, and the core plans again.
    """

    batch: int
    cells: tuple[int, ...]
    held: tuple[tuple[tuple[str, int], ...], ...]
    dropped: tuple[int, ...]
    final: bool
    attempt: int = 0

    @property
    def prefix(self) -> int:
        return len(self.cells)

    def message_ids(self) -> list[str]:
        return [m for held in self.held for m, _ in held]

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> ReducePlan:
        return msgspec.msgpack.decode(data, type=cls)


@dataclass(frozen=True, slots=True)
class Wait:
    """Not yet: some cell is still computing, or a dead cell's claims are not yet idle enough."""

    reason: str


@dataclass(frozen=True, slots=True)
class TakeOver:
    """The core must claim these entries itself: their holders are outside the live prefix."""

    message_ids: tuple[str, ...]


def live_prefix(members: Collection[int], alive: Collection[int], drained: Collection[int]) -> int:
    """k such that cells 1..k-1 are members, alive and drained (the core always counts)."""
    k = 1
    while k in members and k in alive and k in drained:
        k += 1
    return k


def plan_reduction(
    *,
    batch: int,
    micro_steps: int,
    members: Collection[int],
    alive: Collection[int],
    drained: Mapping[int, Mapping[str, int]],
    core_held: Mapping[str, int],
    pending: Sequence[PendingClaim],
    final: bool,
    attempt: int = 0,
) -> ReducePlan | Wait | TakeOver:
    """Decide the reduction of `batch`; call only after every task was delivered.

    `drained[c]` is what satellite c reported holding (message id -> micro-step) when it stopped
    claiming; `core_held` is the core's own. Raises ContributionError when the reports and the
    pending claims disagree, so a micro-step would be lost or counted twice.
    """
    k = live_prefix(members, alive, drained)
    prefix = set(range(k))
    takeover: list[str] = []
    for claim in pending:
        holder = claim.cell
        if holder == CORE:
            if claim.message_id not in core_held:
                raise ContributionError(f"the core holds {claim.message_id} but did not accumulate it")
        elif holder not in alive:
            return Wait(f"cell {holder} stopped renewing; its claims wait for takeover")
        elif holder not in drained:
            return Wait(f"cell {holder} is still computing")
        elif claim.message_id not in drained[holder]:
            raise ContributionError(f"cell {holder} holds {claim.message_id} but did not report it")
        elif holder not in prefix:
            takeover.append(claim.message_id)
    if takeover:
        return TakeOver(tuple(takeover))
    waiting = [c for c in members if c in alive and c not in drained and c != CORE]
    if waiting:
        return Wait(f"cells {sorted(waiting)} have not drained")
    owner = {c.message_id: c.cell for c in pending}
    held: list[tuple[tuple[str, int], ...]] = [tuple(sorted(core_held.items()))]
    for cell in range(1, k):
        report = drained[cell]
        # A report naming a claim no longer pending means another cell took it over: the
        # reporter still has its gradient, which would then be counted twice.
        stale = sorted(m for m in report if owner.get(m) != cell)
        if stale:
            raise ContributionError(f"cell {cell} reported {stale} which it no longer holds")
        held.append(tuple(sorted(report.items())))
    indices = sorted(i for cell_held in held for _, i in cell_held)
    if indices != list(range(micro_steps)):
        raise ContributionError(
            f"batch {batch}: the prefix holds micro-steps {indices}, expected 0..{micro_steps - 1} once each"
        )
    dropped = tuple(sorted(c for c in members if c not in prefix and c in alive and c != CORE))
    return ReducePlan(batch, tuple(range(k)), tuple(held), dropped, final, attempt)
