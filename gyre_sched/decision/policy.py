"""The three role-allocation policies behind one interface, so one decision core compares them.

Elastic (QwenGyre): cells join training one at a time while eq. 2 and the supply check
hold, and the core may stay past a burst end (eq. 3). Colocate: the cells form one
unit that switches only when the separate pool alone can hold the outstanding work.
Async: every cell trains for the whole run and only the pool rolls out.
"""

from __future__ import annotations

import enum
from typing import Protocol

from gyre_sched.config import PolicyKind, SchedConfig
from gyre_sched.decision.ledger import core_may_stay, may_join


class CellRole(enum.Enum):
    """The role of one cell; a cell holds exactly one at a time."""

    ROLLOUT = "rollout"
    TO_TRAIN = "to_train"
    TRAIN = "train"
    TO_ROLLOUT = "to_rollout"


class Policy(Protocol):
    """What differs between Elastic, Colocate and Async; the decision core does the rest."""

    kind: PolicyKind

    def initial_train_cells(self, cfg: SchedConfig) -> int:
        """How many cells (a prefix) start, and stay, in training."""
        ...

    def cells_move(self) -> bool:
        """Whether cells ever change role."""
        ...

    def join_gate(self, cfg: SchedConfig, w: int, c_r: int, k: int) -> bool:
        """Whether the next cell may leave rollout now (supply aside)."""
        ...

    def core_stays(self, cfg: SchedConfig, w: int) -> bool:
        """Capacity side of the end-of-burst decision for the core."""
        ...


class ElasticPolicy:
    """QwenGyre: fine-grained cells gated by the waterlevel."""

    kind = PolicyKind.ELASTIC

    def initial_train_cells(self, cfg: SchedConfig) -> int:
        return 0

    def cells_move(self) -> bool:
        return True

    def join_gate(self, cfg: SchedConfig, w: int, c_r: int, k: int) -> bool:
        return may_join(w, c_r, cfg.cell_capacity)

    def core_stays(self, cfg: SchedConfig, w: int) -> bool:
        incoming = cfg.burst_groups * cfg.group_size
        return core_may_stay(w, incoming, cfg.pool_capacity, cfg.cells, cfg.cell_capacity)


class ColocatePolicy:
    """Colocate: all cells switch as one unit once the pool alone covers the waterlevel."""

    kind = PolicyKind.COLOCATE

    def initial_train_cells(self, cfg: SchedConfig) -> int:
        return 0

    def cells_move(self) -> bool:
        return True

    def join_gate(self, cfg: SchedConfig, w: int, c_r: int, k: int) -> bool:
        # The colocated unit leaves together: every cell still in rollout must be free of
        # work, which is w <= C_s. That implies eq. 2 for each serial step of the switch.
        remaining = cfg.cells - k
        return w <= c_r - remaining * cfg.cell_capacity

    def core_stays(self, cfg: SchedConfig, w: int) -> bool:
        return False  # the whole unit returns to serve the next dispatch


class AsyncPolicy:
    """Async: a fixed partition; the cells train for the whole run."""

    kind = PolicyKind.ASYNC

    def initial_train_cells(self, cfg: SchedConfig) -> int:
        return cfg.cells

    def cells_move(self) -> bool:
        return False

    def join_gate(self, cfg: SchedConfig, w: int, c_r: int, k: int) -> bool:
        return False

    def core_stays(self, cfg: SchedConfig, w: int) -> bool:
        return True


def policy_for(kind: PolicyKind) -> Policy:
    """The policy object for ``kind``."""
    policies: dict[PolicyKind, Policy] = {
        PolicyKind.ELASTIC: ElasticPolicy(),
        PolicyKind.COLOCATE: ColocatePolicy(),
        PolicyKind.ASYNC: AsyncPolicy(),
    }
    return policies[kind]
