"""The discrete-event cluster simulator, driving the same decision core as a live run.

Reads top to bottom: a heap of timed events; each decision-core input goes to the decider
first (the decision core in process, or anything else behind ``Decider``, such as the live
controller over an event log), which carries its decisions out through ``CommandSink`` on
``SimCluster``; then the simulated world reacts to the input (groups become ready, cells
join the trainer). Ties in time resolve by insertion order, so a seed fixes the whole run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gyre_sched.config import SchedConfig
from gyre_sched.decision import (
    BeginTransition,
    ClockTick,
    CoreAtBurstEnd,
    DecisionCore,
    DecisionState,
    Direction,
    DispatchGroups,
    ExecutionFinished,
    GroupClaimed,
    GroupReady,
    Input,
    LogEntry,
    Outcome,
    Placement,
    RunStarted,
    TransitionDone,
    WeightsPublished,
    carry_out,
    policy_for,
)
from gyre_sched.exceptions import ConfigError
from gyre_sched.sim.cluster import ClusterConfig
from gyre_sched.sim.results import SimResult, TransitionRecord, WaterlevelSample
from gyre_sched.sim.time_use import Classifier, TimeAccount
from gyre_sched.sim.training import (
    BroadcastDone,
    EventQueue,
    MicrostepDone,
    PublishDone,
    ReadyPool,
    Scheduled,
    Trainer,
    TrainerEvent,
    UpdateDone,
)
from gyre_sched.sim.workload import HOUR, WorkloadModel


@dataclass
class SimCluster:
    """The simulated cluster as a CommandSink: it turns decisions into future events."""

    sched: SchedConfig
    cluster: ClusterConfig
    workload: WorkloadModel
    rng: np.random.Generator
    pool: ReadyPool
    trainer: Trainer
    now: float = 0.0
    pending: list[Scheduled] = field(default_factory=list)
    duration: dict[int, tuple[float, Outcome]] = field(default_factory=dict)
    version_of: dict[int, int] = field(default_factory=dict)
    reroutes: int = 0
    core_decisions: list[CoreAtBurstEnd] = field(default_factory=list)

    def dispatch_groups(self, decision: DispatchGroups) -> None:
        n = decision.group_size
        self.pool.add_wave(decision.first_group, decision.groups, decision.version)
        for group in range(decision.first_group, decision.first_group + decision.groups):
            self.version_of[group] = decision.version
            sample = self.workload.sample_group(self.rng, n)
            for k in range(n):
                self.duration[group * n + k] = (sample.durations_s[k], sample.outcomes[k])

    def start_executions(self, placements: tuple[Placement, ...]) -> None:
        for placement in placements:
            seconds, outcome = self.duration.pop(placement.execution)
            at = self.now + seconds
            self.pending.append((at, ExecutionFinished(at, placement.execution, outcome)))

    def stop_accepting(self, cell: int) -> None:
        pass  # the simulated engine has no admission queue to close

    def reserve_capacity(self, engine: int, count: int) -> None:
        pass  # the decision core already counted the destination slots

    def update_routing(self, moves: tuple[Placement, ...]) -> None:
        self.reroutes += len(moves)

    def cancel_and_retry(self, source: int, moves: tuple[Placement, ...]) -> None:
        pass  # KV migration: the retried request resumes with no lost progress

    def release_rollout_memory(self, cell: int) -> None:
        pass

    def restore_training_state(self, cell: int) -> None:
        at = self.now + self.cluster.to_train_s
        self.pending.append((at, TransitionDone(at, cell)))

    def release_training_memory(self, cell: int) -> None:
        self.trainer.remove_member(cell)

    def restore_rollout_engine(self, cell: int) -> None:
        at = self.now + self.cluster.to_rollout_s
        self.pending.append((at, TransitionDone(at, cell)))

    def core_decided(self, decision: CoreAtBurstEnd) -> None:
        self.core_decisions.append(decision)

    def schedule_tick(self, wake_at: float) -> None:
        self.pending.append((wake_at, ClockTick(wake_at)))


class Decider(Protocol):
    """What the simulated world hands each decision-core input to."""

    def decide(self, event: Input, world: SimCluster) -> Sequence[LogEntry]:
        """Decide on ``event`` and carry the decisions out on ``world``; return every input
        fed with its decisions (a live controller may feed a due ClockTick beside the fact)."""
        ...

    def state(self) -> DecisionState:
        """The decision core's ledger and roles now."""
        ...


class CoreDecider:
    """The decision core in process: decide, then carry out on the world."""

    def __init__(self, sched: SchedConfig) -> None:
        self._core = DecisionCore(sched)

    def decide(self, event: Input, world: SimCluster) -> Sequence[LogEntry]:
        decisions = self._core.handle(event)
        carry_out(decisions, world)
        return (LogEntry(event, decisions),)

    def state(self) -> DecisionState:
        return self._core.state()


@dataclass
class SimRun:
    """A finished simulation: the result and, when kept, the full decision log."""

    result: SimResult
    log: list[LogEntry]


def simulate(
    sched: SchedConfig,
    cluster: ClusterConfig,
    workload: WorkloadModel,
    *,
    steps: int,
    seed: int,
    name: str = "run",
    keep_log: bool = False,
    on_step: Callable[[int], None] | None = None,
    make_decider: Callable[[SimCluster], Decider] | None = None,
) -> SimRun:
    """Simulate ``steps`` training steps; returns the result (and the log if ``keep_log``).

    ``make_decider`` builds what decides, given the simulated world (default: the decision core
    in process, ``CoreDecider``). Raises ConfigError subclasses for infeasible settings
    before anything runs.
    """
    sched.validate()
    cluster.validate()
    if steps < 1:
        raise ConfigError(f"steps={steps} must be >= 1")
    policy = policy_for(sched.policy)
    pool = ReadyPool()
    trainer = Trainer(sched, cluster, pool, list(range(policy.initial_train_cells(sched))))
    world = SimCluster(sched, cluster, workload, np.random.default_rng(seed), pool, trainer)
    decider = make_decider(world) if make_decider is not None else CoreDecider(sched)
    heap = EventQueue()

    heap.push([(0.0, RunStarted(0.0)), *trainer.open_batch(0.0)])
    log: list[LogEntry] = []
    finished_in_group: dict[int, int] = {}
    step_end: list[float] = []
    staleness: list[int] = []
    transitions: dict[int, int] = {}
    records: list[TransitionRecord] = []
    water: list[WaterlevelSample] = []
    last_sample: tuple[int, int, int] | None = None
    account = TimeAccount()
    classifier = Classifier(sched, policy, cluster.streaming)
    inputs = finished = 0
    n = sched.group_size

    while heap and len(step_end) < steps:
        now, event = heap.pop()
        world.now = now
        if isinstance(event, _TRAINER_EVENTS):
            heap.push(_trainer_event(trainer, event, now))
            if isinstance(event, UpdateDone):
                step_end.append(now)
                if on_step is not None:
                    on_step(len(step_end))
        else:
            inputs += 1
            world.pending = []
            entries = decider.decide(event, world)
            heap.push(world.pending)
            if keep_log:
                log.extend(entries)
            for decision in (d for entry in entries for d in entry.decisions):
                if isinstance(decision, BeginTransition):
                    transitions[decision.cell] = len(records)
                    records.append(
                        TransitionRecord(
                            now,
                            None,
                            decision.cell,
                            decision.direction,
                            decision.w,
                            decision.c_r,
                            decision.c_e,
                        )
                    )
            # the world reacts to the fact after the decision core has decided on it
            match event:
                case ExecutionFinished(execution=execution):
                    finished += 1
                    group = execution // n
                    finished_in_group[group] = finished_in_group.get(group, 0) + 1
                    if finished_in_group[group] == n:
                        del finished_in_group[group]
                        pool.mark_ready(group)
                        heap.push([(now, GroupReady(now, group))])
                case GroupReady():
                    heap.push(trainer.pump(now))
                case WeightsPublished():  # the core is decided: the next batch opens
                    heap.push(trainer.open_batch(now))
                case GroupClaimed(group=group, step=step):
                    staleness.append(step - world.version_of.pop(group))
                case TransitionDone(cell=cell):
                    index = transitions.pop(cell)
                    done = records[index]
                    records[index] = TransitionRecord(
                        done.at_s, now, done.cell, done.direction, done.w, done.c_r, done.c_e
                    )
                    if done.direction is Direction.TO_TRAIN and decider.state().roles[cell].value == "train":
                        heap.push(trainer.add_member(cell, now))
        state = decider.state()
        account.observe(now, classifier.classify(trainer.view(), state, pool.eligible()))
        if isinstance(event, UpdateDone):
            account.end_step()
        if isinstance(event, _TRAINER_EVENTS):
            continue
        sample = (
            state.counters.waterlevel,
            state.rollout_capacity - sched.cell_capacity,
            state.training_cells,
        )
        if sample != last_sample:
            water.append(WaterlevelSample(now, *sample))
            last_sample = sample

    durations = [(end - start) / HOUR for start, end in zip([0.0, *step_end[:-1]], step_end, strict=True)]
    result = SimResult(
        name=name,
        policy=sched.policy.value,
        phi=sched.phi,
        mu=sched.mu,
        cells=sched.cells,
        steps=steps,
        seed=seed,
        workload=workload.name,
        step_end_s=tuple(step_end),
        step_durations_h=tuple(durations),
        total_h=step_end[-1] / HOUR if step_end else float("nan"),
        mean_staleness=float(np.mean(staleness)) if staleness else float("nan"),
        expected_staleness=sched.expected_staleness,
        staleness=tuple(staleness),
        transitions=tuple(records),
        waterlevel=_thin(water, 4000),
        reroutes=world.reroutes,
        executions_finished=finished,
        inputs_processed=inputs,
        time_use=tuple(account.steps),
    )
    return SimRun(result, log)


_TRAINER_EVENTS = (MicrostepDone, UpdateDone, PublishDone, BroadcastDone)


def _trainer_event(trainer: Trainer, event: TrainerEvent, now: float) -> list[Scheduled]:
    """What the trainer schedules when one of its own events comes due."""
    if isinstance(event, MicrostepDone):
        return trainer.microstep_done(event.cell, now)
    if isinstance(event, UpdateDone):
        return trainer.update_done(now)
    if isinstance(event, PublishDone):
        return trainer.publish_done(now)
    return trainer.broadcast_done(now)


def _thin(samples: list[WaterlevelSample], limit: int) -> tuple[WaterlevelSample, ...]:
    """Keep at most about ``limit`` samples, always the first and the last."""
    if len(samples) <= limit:
        return tuple(samples)
    stride = len(samples) // limit + 1
    kept = samples[::stride]
    if kept[-1] is not samples[-1]:
        kept.append(samples[-1])
    return tuple(kept)
