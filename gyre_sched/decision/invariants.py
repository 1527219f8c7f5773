"""An independent checker of a run's log of inputs and decisions.

It rebuilds roles, placements, counters and dispatch waves from the log alone, with
none of the decision core's code, so it can audit simulated runs and replays of live runs
alike. Each check names the invariant of the paper it guards.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import msgspec

from gyre_sched.config import SchedConfig
from gyre_sched.decision.codec import LogEntry, flatten
from gyre_sched.decision.decisions import (
    POOL,
    BeginTransition,
    CoreAtBurstEnd,
    Decision,
    Direction,
    DispatchGroups,
    RequestTick,
    Reroute,
    StartExecutions,
)
from gyre_sched.decision.inputs import (
    ExecutionFinished,
    GroupClaimed,
    Input,
    PoolCapacityChanged,
    TransitionDone,
)
from gyre_sched.decision.policy import CellRole, policy_for


class ViolationKind(enum.Enum):
    """Which invariant a log broke."""

    WATERLEVEL = "waterlevel"  # a cell left rollout while w > C_R - C_e
    NOT_SERIAL = "not_serial"  # a transition to training overlapped another transition
    NOT_CORE_FIRST = "not_core_first"  # the training cells stopped being a prefix, core first
    BOTH_ROLES = "both_roles"  # a cell served executions while not in the rollout role
    ORPHANED = "orphaned"  # an execution was left without an engine during a transition
    OVER_CAPACITY = "over_capacity"  # an engine was given more executions than it holds
    COUNTER = "counter"  # d, p or f decreased, or p > d, or f > p
    STALENESS = "staleness"  # a group consumed before its dispatch version, never dispatched, or twice


class Violation(msgspec.Struct, frozen=True):
    """One broken invariant, where and why."""

    kind: ViolationKind
    at: float
    detail: str


class _Checker:
    def __init__(self, cfg: SchedConfig) -> None:
        self.cfg = cfg
        fixed = policy_for(cfg.policy).initial_train_cells(cfg)
        self.roles = [CellRole.TRAIN if i < fixed else CellRole.ROLLOUT for i in range(cfg.cells)]
        self.engine_of: dict[int, int] = {}
        self.load = {engine: 0 for engine in (POOL, *range(cfg.cells))}
        self.d = self.p = self.f = 0
        self.version_of: dict[int, int] = {}  # dispatched, unconsumed group -> v_d
        self.awaiting_reroute: int | None = None
        self.out: list[Violation] = []

    def flag(self, kind: ViolationKind, at: float, detail: str) -> None:
        self.out.append(Violation(kind, at, detail))

    def capacity(self, engine: int) -> int:
        return self.cfg.pool_capacity if engine == POOL else self.cfg.cell_capacity

    def serving(self, engine: int) -> bool:
        return engine == POOL or (0 <= engine < self.cfg.cells and self.roles[engine] is CellRole.ROLLOUT)

    def k(self) -> int:
        return sum(role is not CellRole.ROLLOUT for role in self.roles)

    def counters(self, at: float) -> None:
        if not self.d >= self.p >= self.f >= 0:
            self.flag(
                ViolationKind.COUNTER, at, f"need d >= p >= f >= 0, have d={self.d} p={self.p} f={self.f}"
            )

    def place(self, execution: int, engine: int, at: float) -> None:
        if not self.serving(engine):
            self.flag(
                ViolationKind.BOTH_ROLES,
                at,
                f"execution {execution} placed on engine {engine}, not in rollout",
            )
        old = self.engine_of.get(execution)
        if old is not None:
            self.load[old] -= 1
        self.engine_of[execution] = engine
        self.load[engine] = self.load.get(engine, 0) + 1
        if self.load[engine] > self.capacity(engine):
            self.flag(
                ViolationKind.OVER_CAPACITY,
                at,
                f"engine {engine} holds {self.load[engine]} > {self.capacity(engine)}",
            )

    def on_input(self, event: Input) -> None:
        self.close_reroute(event.at)
        match event:
            case ExecutionFinished(execution=execution):
                engine = self.engine_of.pop(execution, None)
                if engine is not None:
                    self.load[engine] -= 1
                self.f += 1
                self.counters(event.at)
            case PoolCapacityChanged(capacity=capacity):
                self.cfg = msgspec.structs.replace(self.cfg, pool_capacity=capacity)
            case TransitionDone(cell=cell):
                role = self.roles[cell]
                self.roles[cell] = CellRole.TRAIN if role is CellRole.TO_TRAIN else CellRole.ROLLOUT
            case GroupClaimed(group=group, step=step):
                version = self.version_of.pop(group, None)
                if version is None:
                    self.flag(
                        ViolationKind.STALENESS,
                        event.at,
                        f"group {group} consumed but never dispatched, or twice",
                    )
                    return
                # Only d >= 0 holds group by group: the packer takes ready groups oldest
                # version first, so a straggler may be consumed any number of steps later,
                # and a group of a newer wave may overtake it. Boundary dispatch fixes the
                # mean staleness (Theorem A.1), not each group's.
                if step < version:
                    self.flag(
                        ViolationKind.STALENESS,
                        event.at,
                        f"group {group} (v_d={version}) consumed at step {step}: negative staleness",
                    )
            case _:
                pass

    def close_reroute(self, at: float) -> None:
        cell = self.awaiting_reroute
        if cell is None:
            return
        self.awaiting_reroute = None
        left = [e for e, engine in self.engine_of.items() if engine == cell]
        if left:
            self.flag(
                ViolationKind.ORPHANED, at, f"{len(left)} executions left on cell {cell} as it left rollout"
            )

    def on_decision(self, decision: Decision) -> None:
        at = decision.at
        match decision:
            case DispatchGroups(
                first_group=first, groups=groups, group_size=size, version=version, d_after=d_after
            ):
                for group in range(first, first + groups):
                    self.version_of[group] = version
                if d_after < self.d:
                    self.flag(ViolationKind.COUNTER, at, f"d went from {self.d} to {d_after}")
                elif d_after != self.d + groups * size:
                    self.flag(
                        ViolationKind.COUNTER,
                        at,
                        f"d_after={d_after} but {groups} groups of {size} were added to {self.d}",
                    )
                self.d = max(self.d, d_after)
                self.counters(at)
            case StartExecutions(placements=placements, p_after=p_after):
                for placement in placements:
                    self.place(placement.execution, placement.engine, at)
                if p_after < self.p:
                    self.flag(ViolationKind.COUNTER, at, f"p went from {self.p} to {p_after}")
                self.p = max(self.p, p_after)
                self.counters(at)
            case BeginTransition(direction=Direction.TO_TRAIN):
                self.begin_to_train(decision)
            case BeginTransition(cell=cell, direction=Direction.TO_ROLLOUT):
                if any(role is CellRole.TO_TRAIN for role in self.roles):
                    self.flag(
                        ViolationKind.NOT_SERIAL, at, f"cell {cell} returns while a cell is joining training"
                    )
                if self.roles[cell] is not CellRole.TRAIN:
                    self.flag(
                        ViolationKind.BOTH_ROLES,
                        at,
                        f"cell {cell} returns to rollout from {self.roles[cell].value}",
                    )
                self.roles[cell] = CellRole.TO_ROLLOUT
            case Reroute(source=source, moves=moves):
                for move in moves:
                    if move.engine == source:
                        self.flag(
                            ViolationKind.ORPHANED,
                            at,
                            f"execution {move.execution} rerouted onto its own source",
                        )
                    self.place(move.execution, move.engine, at)
                self.close_reroute(at)
            case _:
                pass

    def begin_to_train(self, decision: BeginTransition) -> None:
        cfg, at, cell = self.cfg, decision.at, decision.cell
        w = self.d - self.f
        c_r = cfg.pool_capacity + (cfg.cells - self.k()) * cfg.cell_capacity
        if w > c_r - cfg.cell_capacity or decision.w > decision.c_r - decision.c_e:
            self.flag(
                ViolationKind.WATERLEVEL,
                at,
                f"cell {cell} left rollout with w={w} > C_R - C_e = {c_r - cfg.cell_capacity}",
            )
        if any(role in (CellRole.TO_TRAIN, CellRole.TO_ROLLOUT) for role in self.roles):
            self.flag(
                ViolationKind.NOT_SERIAL, at, f"cell {cell} began a transition while another was in flight"
            )
        prefix = self.k()
        if cell != prefix or self.roles[cell] is not CellRole.ROLLOUT:
            self.flag(
                ViolationKind.NOT_CORE_FIRST,
                at,
                f"cell {cell} joined training but the next in order is cell {prefix}",
            )
        self.roles[cell] = CellRole.TO_TRAIN
        self.awaiting_reroute = cell


def check_log(cfg: SchedConfig, log: Sequence[LogEntry] | Iterable[Input | Decision]) -> list[Violation]:
    """Every invariant violation in ``log`` (a list of LogEntry or a flat sequence), in order."""
    flat: list[Input | Decision] = []
    for item in log:
        if isinstance(item, LogEntry):
            flat.extend(flatten([item]))
        else:
            flat.append(item)
    checker = _Checker(cfg)
    for item in flat:
        if isinstance(
            item, DispatchGroups | StartExecutions | BeginTransition | Reroute | CoreAtBurstEnd | RequestTick
        ):
            checker.on_decision(item)
        else:
            checker.on_input(item)
    checker.close_reroute(float("inf"))
    return checker.out
