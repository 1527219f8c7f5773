"""The decision core: one deterministic state machine shared by the live controller,
a replay of the event log and the simulator.

``DecisionCore.handle(input)`` returns the decisions that input causes and nothing
else; it performs no I/O and reads no clock but the ``at`` of its inputs, so the same
input sequence always yields the same decision sequence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import msgspec

from gyre_sched.config import SchedConfig
from gyre_sched.decision.codec import LogEntry
from gyre_sched.decision.counters import Counters
from gyre_sched.decision.decisions import (
    POOL,
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
from gyre_sched.decision.destinations import assign, destination_order
from gyre_sched.decision.inputs import (
    BatchClosed,
    BatchStarted,
    ClockTick,
    ExecutionFinished,
    GroupClaimed,
    GroupReady,
    Input,
    PoolCapacityChanged,
    RunStarted,
    TransitionDone,
    WeightsPublished,
)
from gyre_sched.decision.ledger import rollout_capacity, supply, supply_threshold
from gyre_sched.decision.policy import CellRole, policy_for
from gyre_sched.exceptions import InputOrderError


class DecisionState(msgspec.Struct, frozen=True):
    """A read-only snapshot of the decision core, for recorders and checks."""

    counters: Counters
    roles: tuple[CellRole, ...]
    training_cells: int
    rollout_capacity: int
    version: int
    ready_unclaimed: int


class DecisionCore:
    """The scheduling plane's decisions for one run; feed it inputs in time order."""

    def __init__(self, cfg: SchedConfig) -> None:
        self.cfg = cfg.validate()
        self.policy = policy_for(cfg.policy)
        fixed = self.policy.initial_train_cells(cfg)
        self._roles = [CellRole.TRAIN if i < fixed else CellRole.ROLLOUT for i in range(cfg.cells)]
        self._counters = Counters()
        self._version = 0
        self._now = 0.0
        self._started = False
        self._next_group = 0
        self._queue: deque[int] = deque()
        self._engine_of: dict[int, int] = {}
        self._load = {engine: 0 for engine in (POOL, *range(cfg.cells))}
        self._ready_unclaimed = 0
        self._batch_step: int | None = None
        self._batch_claimed = 0
        self._supply_since: float | None = None
        self._wake_at: float | None = None
        self._in_flight: set[int] = set()
        self._return_after_join: set[int] = set()
        self._threshold = supply_threshold(cfg.rho_min, cfg.batch_groups)

    # -- views -------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether the run has started (every other input is refused before RunStarted)."""
        return self._started

    @property
    def training_cells(self) -> int:
        """k(t): cells not in the rollout role (training or changing role)."""
        return sum(role is not CellRole.ROLLOUT for role in self._roles)

    @property
    def rollout_capacity(self) -> int:
        """C_R(t) of eq. 1."""
        cfg = self.cfg
        return rollout_capacity(cfg.pool_capacity, cfg.cells, self.training_cells, cfg.cell_capacity)

    def state(self) -> DecisionState:
        """A snapshot of the ledger and roles."""
        return DecisionState(
            counters=self._counters,
            roles=tuple(self._roles),
            training_cells=self.training_cells,
            rollout_capacity=self.rollout_capacity,
            version=self._version,
            ready_unclaimed=self._ready_unclaimed,
        )

    # -- the one entry point -----------------------------------------------------------

    def handle(self, event: Input) -> tuple[Decision, ...]:
        """Apply one input; return the decisions it causes. Raises InputOrderError on an
        input that contradicts the state (time going backwards, unknown execution, ...)."""
        if event.at < self._now:
            raise InputOrderError(
                f"input at t={event.at} arrived after t={self._now}: inputs must be in time order"
            )
        self._now = event.at
        if not self._started and not isinstance(event, RunStarted):
            raise InputOrderError(f"{type(event).__name__} before RunStarted")
        out: list[Decision] = []
        match event:
            case RunStarted():
                if self._started:
                    raise InputOrderError("RunStarted twice")
                self._started = True
                out += self._dispatch(self.cfg.initial_groups)
                out += self._start()
            case ExecutionFinished(execution=execution):
                engine = self._engine_of.pop(execution, None)
                if engine is None:
                    raise InputOrderError(f"execution {execution} finished but is not running")
                self._load[engine] -= 1
                self._counters = self._counters.advance(finished=1)
                out += self._start()
                out += self._maybe_join()
            case GroupReady():
                self._ready_unclaimed += 1
                out += self._maybe_join()
            case GroupClaimed(step=step):
                if self._batch_step != step:
                    raise InputOrderError(
                        f"group claimed for step {step} but the open batch is {self._batch_step}"
                    )
                if self._ready_unclaimed < 1:
                    raise InputOrderError("group claimed with no ready, unclaimed group")
                self._ready_unclaimed -= 1
                self._batch_claimed += 1
                out += self._maybe_join()
            case BatchStarted(step=step):
                if self._batch_step is not None:
                    raise InputOrderError(f"batch {step} started while batch {self._batch_step} is open")
                self._batch_step, self._batch_claimed = step, 0
                self._supply_since = None  # the supply timer resets at each batch start
                out += self._maybe_join()
            case BatchClosed(step=step):
                if self._batch_step != step:
                    raise InputOrderError(f"batch {step} closed but the open batch is {self._batch_step}")
                self._batch_step = None
                if (step + 1) % self.cfg.mu == 0:
                    out += self._satellites_return()
            case WeightsPublished(version=version):
                if version < self._version:
                    raise InputOrderError(f"version {version} published after {self._version}")
                self._version = version
                out += self._core_at_burst_end()
                out += self._dispatch(self.cfg.burst_groups)
                out += self._start()
            case TransitionDone(cell=cell):
                out += self._transition_done(cell)
            case ClockTick():
                out += self._maybe_join()
            case PoolCapacityChanged(capacity=capacity):
                if capacity < 0:
                    raise InputOrderError(f"pool capacity {capacity} is negative")
                # C_s of every rule from now on; the configured value was only the first.
                self.cfg = msgspec.structs.replace(self.cfg, pool_capacity=capacity)
                out += self._start()
                out += self._maybe_join()
        return tuple(out)

    # -- boundary dispatch and starts --------------------------------------------------

    def _dispatch(self, groups: int) -> list[Decision]:
        n = self.cfg.group_size
        first = self._next_group
        self._next_group += groups
        self._queue.extend(range(first * n, (first + groups) * n))
        self._counters = self._counters.advance(dispatched=groups * n)
        return [DispatchGroups(self._now, first, groups, n, self._version, self._counters.d)]

    def _free(self) -> dict[int, int]:
        free = {POOL: max(0, self.cfg.pool_capacity - self._load[POOL])}  # a lost engine's still run
        for cell, role in enumerate(self._roles):
            if role is CellRole.ROLLOUT:  # an engine still restoring is not ready
                free[cell] = self.cfg.cell_capacity - self._load[cell]
        return free

    def _order(self, exclude: int | None = None) -> list[int]:
        cells = (c for c, role in enumerate(self._roles) if role is CellRole.ROLLOUT and c != exclude)
        return destination_order(self.cfg.pool_capacity, cells)

    def _start(self) -> list[Decision]:
        free = self._free()
        n = min(self._counters.queued, self.rollout_capacity - self._counters.running, sum(free.values()))
        if n <= 0:
            return []
        chosen = [self._queue.popleft() for _ in range(n)]
        placements = assign(chosen, self._order(), free)
        assert len(placements) == n, "free capacity was counted from the same engines"
        self._place(placements)
        self._counters = self._counters.advance(started=n)
        return [StartExecutions(self._now, placements, self._counters.p)]

    def _place(self, placements: Iterable[Placement]) -> None:
        for placement in placements:
            old = self._engine_of.get(placement.execution)
            if old is not None:
                self._load[old] -= 1
            self._engine_of[placement.execution] = placement.engine
            self._load[placement.engine] += 1

    # -- role transitions --------------------------------------------------------------

    def _maybe_join(self) -> list[Decision]:
        cfg = self.cfg
        if not self.policy.cells_move() or self._batch_step is None or self._in_flight:
            return []
        k = self.training_cells
        if k >= cfg.cells:
            return []
        if supply(self._ready_unclaimed, cfg.batch_groups - self._batch_claimed) < self._threshold:
            self._supply_since = None
            return []
        if self._supply_since is None:
            self._supply_since = self._now
        if not self.policy.join_gate(cfg, self._counters.waterlevel, self.rollout_capacity, k):
            return []
        wake = self._supply_since + cfg.tau_s
        if self._now < wake:
            if self._wake_at == wake:
                return []
            self._wake_at = wake
            return [RequestTick(self._now, wake)]
        self._supply_since = None  # the timer resets after every transition
        return self._begin_to_train(k)

    def _begin(self, cell: int, direction: Direction, k_after: int) -> BeginTransition:
        decision = BeginTransition(
            self._now,
            cell,
            direction,
            self._counters.waterlevel,
            self.rollout_capacity,
            self.cfg.cell_capacity,
            k_after,
        )
        self._in_flight.add(cell)
        return decision

    def _begin_to_train(self, cell: int) -> list[Decision]:
        if self._roles[cell] is not CellRole.ROLLOUT:
            raise InputOrderError(f"cell {cell} is {self._roles[cell].value}, not rollout: prefix broken")
        begin = self._begin(cell, Direction.TO_TRAIN, self.training_cells + 1)
        moving = sorted(e for e, engine in self._engine_of.items() if engine == cell)
        moves = assign(moving, self._order(exclude=cell), self._free())
        if len(moves) != len(moving):
            raise InputOrderError(f"no room to reroute {len(moving) - len(moves)} executions off cell {cell}")
        self._place(moves)
        self._roles[cell] = CellRole.TO_TRAIN
        return [begin, Reroute(self._now, cell, moves)]

    def _begin_to_rollout(self, cell: int) -> list[Decision]:
        begin = self._begin(cell, Direction.TO_ROLLOUT, self.training_cells - 1)
        self._roles[cell] = CellRole.TO_ROLLOUT
        return [begin]

    def _satellites_return(self) -> list[Decision]:
        if not self.policy.cells_move():
            return []
        out: list[Decision] = []
        for cell in range(1, self.cfg.cells):
            if self._roles[cell] is CellRole.TRAIN:
                out += self._begin_to_rollout(cell)
            elif self._roles[cell] is CellRole.TO_TRAIN:
                self._return_after_join.add(cell)
        return out

    def _core_at_burst_end(self) -> list[Decision]:
        cfg = self.cfg
        if not self.policy.cells_move() or self._roles[0] is CellRole.ROLLOUT:
            return []
        w = self._counters.waterlevel
        stays = (
            self._roles[0] is CellRole.TRAIN
            and self._ready_unclaimed >= self._threshold
            and self.policy.core_stays(cfg, w)
        )
        decision = CoreAtBurstEnd(
            self._now,
            stays,
            w,
            cfg.burst_groups * cfg.group_size,
            cfg.pool_capacity + (cfg.cells - 1) * cfg.cell_capacity,
            self._ready_unclaimed,
            self._threshold,
        )
        out: list[Decision] = [decision]
        if not stays:
            if self._roles[0] is CellRole.TRAIN:
                out += self._begin_to_rollout(0)
            elif self._roles[0] is CellRole.TO_TRAIN:
                self._return_after_join.add(0)
        return out

    def _transition_done(self, cell: int) -> list[Decision]:
        if cell not in self._in_flight:
            raise InputOrderError(f"cell {cell} finished a transition it never began")
        self._in_flight.discard(cell)
        out: list[Decision] = []
        if self._roles[cell] is CellRole.TO_TRAIN:
            self._roles[cell] = CellRole.TRAIN
            if cell in self._return_after_join:
                self._return_after_join.discard(cell)
                out += self._begin_to_rollout(cell)
        else:
            self._roles[cell] = CellRole.ROLLOUT
            out += self._start()
        self._supply_since = None  # the timer resets after every transition
        out += self._maybe_join()
        return out


def run_decisions(cfg: SchedConfig, inputs: Iterable[Input]) -> list[LogEntry]:
    """Feed ``inputs`` to a fresh decision core; return each input with its decisions (a replay)."""
    decider = DecisionCore(cfg)
    return [LogEntry(event, decider.handle(event)) for event in inputs]
