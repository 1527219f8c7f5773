"""The outputs of the decision core: typed, frozen, tagged structs.

A decision is what the scheduler has decided, with the ledger values in force when it
did, so that a log of decisions can be audited without re-running the decision core.
Engines are numbered: POOL (-1) is the separate rollout pool, 0..K-1 are the cells.
"""

from __future__ import annotations

import enum

import msgspec

POOL = -1  # engine id of the separate rollout pool


class Direction(enum.Enum):
    """Which way a cell changes role."""

    TO_TRAIN = "rollout_to_train"
    TO_ROLLOUT = "train_to_rollout"


class Placement(msgspec.Struct, frozen=True, array_like=True):
    """Execution ``execution`` runs on engine ``engine``."""

    execution: int
    engine: int


class DispatchGroups(msgspec.Struct, frozen=True, tag=True):
    """Dispatch groups first_group .. first_group + groups - 1 under policy ``version``."""

    at: float
    first_group: int
    groups: int
    group_size: int
    version: int
    d_after: int


class StartExecutions(msgspec.Struct, frozen=True, tag=True):
    """Start these queued executions on these engines."""

    at: float
    placements: tuple[Placement, ...]
    p_after: int


class BeginTransition(msgspec.Struct, frozen=True, tag=True):
    """Cell ``cell`` starts changing role; w, C_R and C_e are the values in force before it."""

    at: float
    cell: int
    direction: Direction
    w: int
    c_r: int
    c_e: int
    k_after: int


class Reroute(msgspec.Struct, frozen=True, tag=True):
    """Move the running executions of ``source`` cell to the destinations given."""

    at: float
    source: int
    moves: tuple[Placement, ...]


class CoreAtBurstEnd(msgspec.Struct, frozen=True, tag=True):
    """Whether the core cell stays in training (eq. 3 and the supply check) after a burst."""

    at: float
    stays: bool
    w: int
    incoming: int  # mu N B, about to be dispatched
    capacity: int  # C_s + (K - 1) C_e
    ready: int
    ready_needed: int


class RequestTick(msgspec.Struct, frozen=True, tag=True):
    """Ask the world for a ClockTick at ``wake_at`` (the supply timer expires then)."""

    at: float
    wake_at: float


Decision = DispatchGroups | StartExecutions | BeginTransition | Reroute | CoreAtBurstEnd | RequestTick

DECISION_TYPES: tuple[type[Decision], ...] = (
    DispatchGroups,
    StartExecutions,
    BeginTransition,
    Reroute,
    CoreAtBurstEnd,
    RequestTick,
)
