"""Where a simulated run's time goes: every second of the training timeline, by cause.

A run's total is the end of its last optimizer update, so the trainer's timeline is the
critical path. After each event the simulator classifies the state it leaves (trainer
phase, busy cells, ready work, the decision core's ledger) into one ``TimeUse`` and holds
it until the next event; the seconds are kept per step. This module only accounts: it
changes no decision and no timing. ``python -m gyre_sched.sim.explain`` prints the account
of a preset (docs/scheduler.md, "Where the elastic rows' time goes").
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

import msgspec

from gyre_sched.config import SchedConfig
from gyre_sched.decision import (
    CellRole,
    DecisionState,
    DispatchGroups,
    ExecutionFinished,
    GroupClaimed,
    GroupReady,
    LogEntry,
    Outcome,
    Policy,
    StartExecutions,
    supply,
)
from gyre_sched.decision.ledger import supply_threshold
from gyre_sched.sim.training import Phase, TrainerView
from gyre_sched.sim.workload import HOUR


class TimeUse(enum.Enum):
    """What holds the training timeline during an interval."""

    # rollout-bound: the open batch has no ready work left
    WAIT_IDLE = "waiting for ready groups, no cell computing"
    WAIT_TRAINING = "waiting for ready groups, training keeps up"
    # ready work waits and no cell computes it: what keeps the next cell out of training
    JOIN_SUPPLY = "no cell computing: supply below rho_min B"
    JOIN_WATERLEVEL = "no cell computing: the join gate holds the next cell (eq. 2; Colocate w <= C_s)"
    JOIN_TAU = "no cell computing: supply timer tau"
    JOIN_TRANSITION = "no cell computing: a transition in flight"
    # training-bound: cells compute while ready work waits; what keeps one more cell out
    BOUND_SUPPLY = "training-bound: supply below rho_min B"
    BOUND_WATERLEVEL = "training-bound: the join gate holds the next cell (eq. 2; Colocate w <= C_s)"
    BOUND_TAU = "training-bound: supply timer tau"
    BOUND_TRANSITION = "training-bound: a transition in flight"
    BOUND_ALL = "training-bound: no other cell can help (all train, Async partition, non-streaming)"
    # the batch holds all its groups; its last micro-steps run
    BATCH_TAIL = "batch tail: all B groups claimed, last micro-steps"
    UPDATE = "optimizer update"
    BROADCAST = "broadcast to satellites"
    PUBLICATION = "weight publication"


class _Holder(enum.Enum):
    SUPPLY = "supply"
    WATERLEVEL = "waterlevel"
    TAU = "tau"
    TRANSITION = "transition"
    ALL = "all"


_JOIN = {
    _Holder.SUPPLY: TimeUse.JOIN_SUPPLY,
    _Holder.WATERLEVEL: TimeUse.JOIN_WATERLEVEL,
    _Holder.TAU: TimeUse.JOIN_TAU,
    _Holder.TRANSITION: TimeUse.JOIN_TRANSITION,
    _Holder.ALL: TimeUse.WAIT_IDLE,  # no cell may ever train here: cannot happen with work waiting
}
_BOUND = {
    _Holder.SUPPLY: TimeUse.BOUND_SUPPLY,
    _Holder.WATERLEVEL: TimeUse.BOUND_WATERLEVEL,
    _Holder.TAU: TimeUse.BOUND_TAU,
    _Holder.TRANSITION: TimeUse.BOUND_TRANSITION,
    _Holder.ALL: TimeUse.BOUND_ALL,
}


class Classifier:
    """Maps the simulated world's state to a ``TimeUse``; pure, built once per run."""

    def __init__(self, sched: SchedConfig, policy: Policy, streaming: bool) -> None:
        self._sched = sched
        self._policy = policy
        self._streaming = streaming
        self._threshold = supply_threshold(sched.rho_min, sched.batch_groups)

    def classify(self, trainer: TrainerView, state: DecisionState, ready: int) -> TimeUse:
        """``ready``: ready groups the packer could claim now."""
        if trainer.phase is Phase.UPDATING:
            return TimeUse.UPDATE
        if trainer.phase is not Phase.OPEN:
            return TimeUse.PUBLICATION if trainer.publishing else TimeUse.BROADCAST
        b = self._sched.batch_groups
        if self._streaming:
            waiting = trainer.queue > 0 or (ready > 0 and trainer.claimed < b)
            all_claimed = trainer.claimed == b
        else:
            need = b * (self._sched.mu - trainer.step % self._sched.mu)
            waiting = trainer.queue > 0 if trainer.batch_started else ready >= need
            all_claimed = trainer.batch_started
        if waiting:
            holder = self._holder(trainer, state)
            return _BOUND[holder] if trainer.busy else _JOIN[holder]
        if all_claimed:
            return TimeUse.BATCH_TAIL
        return TimeUse.WAIT_TRAINING if trainer.busy else TimeUse.WAIT_IDLE

    def _holder(self, trainer: TrainerView, state: DecisionState) -> _Holder:
        """Why one more cell is not computing this batch."""
        cfg = self._sched
        k = state.training_cells
        if not self._streaming and trainer.batch_started:
            return _Holder.ALL  # a non-streaming batch runs on the cells it started with
        if not self._policy.cells_move() or k >= cfg.cells:
            return _Holder.ALL
        if any(role in (CellRole.TO_TRAIN, CellRole.TO_ROLLOUT) for role in state.roles):
            return _Holder.TRANSITION
        if supply(state.ready_unclaimed, cfg.batch_groups - trainer.claimed) < self._threshold:
            return _Holder.SUPPLY
        if not self._policy.join_gate(cfg, state.counters.waterlevel, state.rollout_capacity, k):
            return _Holder.WATERLEVEL
        return _Holder.TAU


class UseSeconds(msgspec.Struct, frozen=True, array_like=True):
    """Seconds of one step spent in one ``TimeUse``."""

    use: TimeUse
    seconds: float


class StepTimeUse(msgspec.Struct, frozen=True):
    """Where one step's time went, from the previous step's update to its own."""

    step: int
    uses: tuple[UseSeconds, ...]  # the nonzero ones, in ``TimeUse`` order


class TimeAccount:
    """Accumulates the classified intervals of a run, step by step."""

    def __init__(self) -> None:
        self._since = 0.0
        self._current: TimeUse | None = None
        self._open: dict[TimeUse, float] = {}
        self.steps: list[StepTimeUse] = []

    def observe(self, now: float, use: TimeUse) -> None:
        """The world is in ``use`` from ``now`` on (until the next observation)."""
        if self._current is not None and now > self._since:
            self._open[self._current] = self._open.get(self._current, 0.0) + now - self._since
        self._since, self._current = now, use

    def end_step(self) -> None:
        """Close the step whose update ended at the last observation."""
        uses = tuple(UseSeconds(u, self._open[u]) for u in TimeUse if self._open.get(u, 0.0) > 0)
        self.steps.append(StepTimeUse(len(self.steps), uses))
        self._open = {}


def seconds_by_use(steps: Sequence[StepTimeUse]) -> dict[TimeUse, float]:
    """Seconds per ``TimeUse`` over ``steps``, every member present."""
    out = dict.fromkeys(TimeUse, 0.0)
    for step in steps:
        for entry in step.uses:
            out[entry.use] += entry.seconds
    return out


def format_account(name: str, runs: Sequence[Sequence[StepTimeUse]], mu: int) -> str:
    """A text table: mean hours per ``TimeUse`` over ``runs`` (one per seed); with bursts
    of several steps, the first step of each burst apart from the later ones."""
    n = len(runs)
    columns: list[tuple[str, Callable[[int], bool]]] = [("all steps", lambda step: True)]
    if mu > 1:
        columns = [
            ("first step of a burst", lambda step: step % mu == 0),
            ("later steps", lambda step: step % mu != 0),
            *columns,
        ]
    sums = [
        [seconds_by_use([s for s in steps if keep(s.step)]) for steps in runs] for _, keep in columns
    ]  # [column][run]
    rows = [
        (use.value, [sum(t[use] for t in column) / n / 3600 for column in sums])
        for use in TimeUse
        if any(t[use] for column in sums for t in column)
    ]
    width = max(len(label) for label, _ in rows)
    heads = [max(len(head), 7) for head, _ in columns]
    lines = [
        f"{name}: where the time goes, hours (mean of {n} run(s))",
        "  ".join([" " * width, *(f"{head:>{w}}" for (head, _), w in zip(columns, heads, strict=True))]),
    ]
    for label, hours in [*rows, ("total", [sum(h[i] for _, h in rows) for i in range(len(columns))])]:
        lines.append(
            "  ".join([f"{label:{width}}", *(f"{h:{w}.2f}" for h, w in zip(hours, heads, strict=True))])
        )
    return "\n".join(lines)


class BurstReadiness(msgspec.Struct, frozen=True):
    """When a burst's last consumed group came ready, and why then (hours from its dispatch).

    ``wave_*`` count the groups dispatched at the burst's start: how many hold an execution
    that ended at a ceiling (harness timeout or overall budget; of the executions that ended
    within the run), and how many had an execution wait in the queue.
    """

    burst: int
    start_h: float  # the burst's dispatch (the previous publication), from the run's start
    last_group: int  # the latest-ready group the burst consumed
    last_ready_h: float  # when it came ready
    last_dispatched_h: float  # that group's dispatch (negative: an earlier wave)
    last_start_delay_h: float  # its latest-ending execution: from the dispatch to its start
    last_duration_h: float  # that execution's duration
    last_outcome: Outcome  # how that execution ended
    end_h: float  # the burst's last update
    wave_groups: int
    wave_at_ceiling: int
    wave_queued: int


def burst_readiness(
    sched: SchedConfig, log: Sequence[LogEntry], step_end_s: Sequence[float]
) -> list[BurstReadiness]:
    """Per whole burst of a kept simulation log: what the burst waited for."""
    n, mu = sched.group_size, sched.mu
    dispatched: dict[int, float] = {}
    wave_starts: list[tuple[float, range]] = []
    started: dict[int, float] = {}  # execution -> its start
    ended: dict[int, ExecutionFinished] = {}  # group -> its latest-ending execution
    ceiling: set[int] = set()
    ready: dict[int, float] = {}
    consumed: dict[int, int] = {}  # group -> step
    for entry in log:
        event = entry.input
        if isinstance(event, ExecutionFinished):
            group = event.execution // n
            if event.outcome is not Outcome.COMPLETED:
                ceiling.add(group)
            if group not in ended or event.at >= ended[group].at:
                ended[group] = event
        elif isinstance(event, GroupReady):
            ready[event.group] = event.at
        elif isinstance(event, GroupClaimed):
            consumed[event.group] = event.step
        for decision in entry.decisions:
            if isinstance(decision, DispatchGroups):
                wave = range(decision.first_group, decision.first_group + decision.groups)
                wave_starts.append((decision.at, wave))
                dispatched.update(dict.fromkeys(wave, decision.at))
            elif isinstance(decision, StartExecutions):
                for placement in decision.placements:
                    started.setdefault(placement.execution, decision.at)  # a reroute is no start
    out = []
    for burst in range(len(step_end_s) // mu):
        start, wave = wave_starts[burst]
        groups = [g for g, step in consumed.items() if step // mu == burst]
        last = max(groups, key=lambda g: ready[g])
        final = ended[last]
        out.append(
            BurstReadiness(
                burst=burst,
                start_h=start / HOUR,
                last_group=last,
                last_ready_h=(ready[last] - start) / HOUR,
                last_dispatched_h=(dispatched[last] - start) / HOUR,
                last_start_delay_h=(started[final.execution] - dispatched[last]) / HOUR,
                last_duration_h=(final.at - started[final.execution]) / HOUR,
                last_outcome=final.outcome,
                end_h=(step_end_s[burst * mu + mu - 1] - start) / HOUR,
                wave_groups=len(wave),
                wave_at_ceiling=sum(g in ceiling for g in wave),
                wave_queued=sum(any(started.get(g * n + k, start) > start for k in range(n)) for g in wave),
            )
        )
    return out


def format_readiness(bursts: Sequence[BurstReadiness]) -> str:
    """A text table of ``burst_readiness``."""
    lines = [
        "burst  start h  last group ready h  (dispatched, its last execution: start delay, duration,"
        " end)  last update h  wave: groups, at a ceiling, queued"
    ]
    for b in bursts:
        lines.append(
            f"{b.burst:5d}  {b.start_h:7.2f}  {b.last_ready_h:18.2f}  "
            f"({b.last_dispatched_h:+.2f}, {b.last_start_delay_h:.2f}, {b.last_duration_h:.2f}, "
            f"{b.last_outcome.value})"
            f"  {b.end_h:13.2f}  {b.wave_groups}, {b.wave_at_ceiling}, {b.wave_queued}"
        )
    return "\n".join(lines)
