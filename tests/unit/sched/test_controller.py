"""The controller on an in-memory log: the simulator's world loop writes facts to the store,
the controller reacts through its sink. ``drive`` is also used by the PostgreSQL tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from gyre_sched import (
    BeginTransition,
    ClusterConfig,
    ConfigMismatchError,
    ControllerConflictError,
    Decision,
    DecisionState,
    Direction,
    DispatchGroups,
    GroupClaimed,
    InputOrderError,
    LogEntry,
    Placement,
    SchedConfig,
    simulate,
)
from gyre_sched.decision import ExecutionFinished, Input, RunStarted, TransitionDone
from gyre_sched.live import (
    Controller,
    ProtocolStep,
    SchedDecision,
    SchedInput,
    SchedRejected,
    SchedStep,
    engine_name,
    execution_id,
    fact_event,
    group_id,
    load_run,
    plan_commands,
    replay_run,
    sched_stream,
)
from gyre_sched.sim import WORKLOADS, SimCluster, SimRun
from gyre_sched.testing import RecordingSink
from gyre_store import (
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionStarted,
    GroupDispatched,
    InMemoryEventLog,
    InMemoryProjectionStore,
    NewEvent,
    catalog,
    catch_up,
    lifecycle_projections,
)
from gyre_store.log import EventLog
from tests.unit.sched.helpers import small_cluster, tiny

RUN = "run-1"


class FakeClock:
    """Run time the test sets by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class SimulatedCrash(Exception):
    """The crash ``StoreWorld`` injects into one command: the only failure ``drive`` restarts on."""


@dataclass
class StoreWorld:
    """The cluster as the controller's sink: the simulated cluster reacts, the runner's
    lifecycle facts go to the store, and every call is recorded."""

    log: EventLog
    sim: SimCluster
    calls: RecordingSink = field(default_factory=RecordingSink)
    fail_on: str | None = None  # raise once, before acting, on the first call of this name

    def _call(self, name: str, *args: object) -> None:
        if self.fail_on == name:
            self.fail_on = None
            raise SimulatedCrash(f"simulated crash in {name}")
        getattr(self.calls, name)(*args)
        getattr(self.sim, name)(*args)

    def dispatch_groups(self, decision: DispatchGroups) -> None:
        self._call("dispatch_groups", decision)
        n = decision.group_size
        events: list[NewEvent] = []
        for g in range(decision.first_group, decision.first_group + decision.groups):
            gid = group_id(RUN, g)
            dispatched = GroupDispatched(
                group_id=gid, run_id=RUN, query_id=f"q{g}", size=n, policy_version=decision.version
            )
            events.append(NewEvent(dispatched, idempotency_key=f"disp/{gid}"))
            for e in range(g * n, g * n + n):
                ev = ExecutionDispatched(
                    execution_id=execution_id(RUN, e),
                    run_id=RUN,
                    group_id=gid,
                    policy_version=decision.version,
                )
                events.append(NewEvent(ev, idempotency_key=f"disp/{e}"))
        self.log.append(events)

    def start_executions(self, placements: tuple[Placement, ...]) -> None:
        self._call("start_executions", placements)
        self.log.append(
            [
                NewEvent(
                    ExecutionStarted(
                        execution_id=execution_id(RUN, p.execution), run_id=RUN, engine=engine_name(p.engine)
                    ),
                    idempotency_key=f"start/{p.execution}",
                )
                for p in placements
            ]
        )

    def stop_accepting(self, cell: int) -> None:
        self._call("stop_accepting", cell)

    def reserve_capacity(self, engine: int, count: int) -> None:
        self._call("reserve_capacity", engine, count)

    def update_routing(self, moves: tuple[Placement, ...]) -> None:
        self._call("update_routing", moves)

    def cancel_and_retry(self, source: int, moves: tuple[Placement, ...]) -> None:
        self._call("cancel_and_retry", source, moves)

    def release_rollout_memory(self, cell: int) -> None:
        self._call("release_rollout_memory", cell)

    def restore_training_state(self, cell: int) -> None:
        self._call("restore_training_state", cell)

    def release_training_memory(self, cell: int) -> None:
        self._call("release_training_memory", cell)

    def restore_rollout_engine(self, cell: int) -> None:
        self._call("restore_rollout_engine", cell)

    def core_decided(self, decision: object) -> None:
        self._call("core_decided", decision)

    def schedule_tick(self, wake_at: float) -> None:
        self._call("schedule_tick", wake_at)


class StoreDecider:
    """The live controller as the simulator's decider (``simulate``'s ``make_decider``).

    Each input becomes the store fact a world component would write; the controller, run
    once, reads it, decides, and carries the protocol out through ``StoreWorld``.
    ``restart_every`` replaces the controller by a new one on the same log every that many
    inputs; a ``SimulatedCrash`` from the world is survived by a new controller, any other
    error propagates.
    """

    def __init__(self, log: EventLog, cfg: SchedConfig, world: StoreWorld, restart_every: int | None) -> None:
        self.log, self.cfg, self.world = log, cfg, world
        self.restart_every = restart_every
        self.restarts = self.inputs = 0
        self.controller = self._start()
        self._seen = 0  # sched stream version read back so far

    def _start(self) -> Controller:
        sim = self.world.sim
        return Controller(self.log, self.cfg, self.world, RUN, clock=lambda: sim.now)

    def decide(self, event: Input, world: SimCluster) -> list[LogEntry]:
        self.inputs += 1
        if isinstance(event, RunStarted):
            started = catalog.RunStarted(
                run_id=RUN,
                harness="sim",
                model="sim",
                group_size=self.cfg.group_size,
                batch_groups=self.cfg.batch_groups,
                cells=self.cfg.cells,
                cell_capacity=self.cfg.cell_capacity,
                separate_capacity=self.cfg.pool_capacity,
                phi=self.cfg.phi,
                mu=self.cfg.mu,
            )
            self.log.append([NewEvent(started, idempotency_key=f"run/{RUN}")])
        else:
            fact = fact_event(RUN, event, step=world.trainer.step)
            if fact is not None:  # a ClockTick only wakes the controller
                self.log.append([NewEvent(fact)])
        if self.restart_every is not None and self.inputs % self.restart_every == 0:
            self.controller = self._start()
            self.restarts += 1
        try:
            self.controller.run_once()
        except SimulatedCrash:
            self.controller = self._start()  # the crashed one is gone; a new one finishes its protocol
            self.restarts += 1
            self.controller.run_once()
        return self._recorded_since()

    def state(self) -> DecisionState:
        return self.controller.state()

    def _recorded_since(self) -> list[LogEntry]:
        """The inputs (with their decisions) the controllers recorded since the last call."""
        events = self.log.read_stream(sched_stream(RUN), after_version=self._seen)
        if events:
            self._seen = events[-1].stream_version
        decisions: dict[int, list[Decision]] = {}
        for recorded in events:
            if isinstance(recorded.event, SchedDecision):
                decisions.setdefault(recorded.event.seq, []).append(recorded.event.decision)
        return [
            LogEntry(e.event.input, tuple(decisions.get(e.event.seq, ())))
            for e in events
            if isinstance(e.event, SchedInput)
        ]


@dataclass
class Driven:
    """What a driven run leaves behind."""

    log: EventLog
    world: StoreWorld
    controller: Controller
    restarts: int
    run: SimRun


def drive(
    log: EventLog,
    cfg: SchedConfig,
    *,
    steps: int = 6,
    seed: int = 4,
    cluster: ClusterConfig | None = None,
    restart_every: int | None = None,
    fail_on: str | None = None,
) -> Driven:
    """Run the simulator's own world loop with the store between it and the controller.

    ``simulate`` with the live controller as its decider (``StoreDecider``).
    ``restart_every`` replaces the controller by a new one on the same log every that many
    inputs; ``fail_on`` makes the sink crash once on that command, after which a new
    controller takes over.
    """
    made: list[StoreDecider] = []

    def controller_over_the_store(sim: SimCluster) -> StoreDecider:
        made.append(StoreDecider(log, cfg, StoreWorld(log, sim, fail_on=fail_on), restart_every))
        return made[0]

    run = simulate(
        cfg,
        cluster or small_cluster(),
        WORKLOADS["nl2repo-122b"],
        steps=steps,
        seed=seed,
        keep_log=True,
        make_decider=controller_over_the_store,
    )
    (decider,) = made
    return Driven(log, decider.world, decider.controller, decider.restarts, run)


def recorded(log: EventLog) -> list[LogEntry]:
    return list(load_run(log, RUN).entries)


def steps_of(log: EventLog) -> list[SchedStep]:
    return [e.event for e in log.read_stream(sched_stream(RUN)) if isinstance(e.event, SchedStep)]


# -- tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline() -> Driven:
    return drive(InMemoryEventLog(), tiny())


def test_driven_run_has_transitions_both_ways_and_replays_identically(baseline: Driven) -> None:
    assert baseline.restarts == 0  # nothing was injected: one controller ran the whole run
    entries = recorded(baseline.log)
    begins = [d for e in entries for d in e.decisions if isinstance(d, BeginTransition)]
    assert {d.direction for d in begins} == {Direction.TO_TRAIN, Direction.TO_ROLLOUT}
    assert any(isinstance(e.input, GroupClaimed) for e in entries)
    report = replay_run(baseline.log, RUN)
    assert report.diffs == ()
    assert report.violations == ()
    assert report.lifecycle == ()
    assert report.inputs == len(entries) > 100


def test_store_driven_run_equals_the_plain_simulation(baseline: Driven) -> None:
    """Same seed, same world: the controller through the store decides as the simulator's core."""
    sim = simulate(tiny(), small_cluster(), WORKLOADS["nl2repo-122b"], steps=6, seed=4, keep_log=True)
    assert recorded(baseline.log) == baseline.run.log == sim.log
    assert baseline.run.result == sim.result


def test_restarts_mid_run_give_the_uninterrupted_decision_log(baseline: Driven) -> None:
    restarted = drive(InMemoryEventLog(), tiny(), restart_every=3)
    assert restarted.restarts > 30
    assert recorded(restarted.log) == recorded(baseline.log)
    assert restarted.world.calls.calls == baseline.world.calls.calls  # no command repeated or lost
    assert len(steps_of(restarted.log)) == len(steps_of(baseline.log))


@pytest.mark.parametrize("failing", ["cancel_and_retry", "restore_rollout_engine", "start_executions"])
def test_crash_inside_the_protocol_resumes_at_the_failed_step(baseline: Driven, failing: str) -> None:
    crashed = drive(InMemoryEventLog(), tiny(), fail_on=failing)
    assert crashed.restarts == 1
    assert recorded(crashed.log) == recorded(baseline.log)
    assert crashed.world.calls.calls == baseline.world.calls.calls
    keys = [(s.seq, s.ordinal) for s in steps_of(crashed.log)]
    assert keys == [(s.seq, s.ordinal) for s in steps_of(baseline.log)]


def test_a_restarted_controller_writes_nothing_when_nothing_is_new(baseline: Driven) -> None:
    head = baseline.log.head()
    sink = RecordingSink()
    again = Controller(baseline.log, tiny(), sink, RUN, clock=lambda: 0.0)
    assert again.checkpoint == baseline.controller.checkpoint
    assert again.state() == baseline.controller.state()
    assert baseline.log.head() == head
    assert sink.calls == []


def test_transition_steps_follow_the_protocol_in_order(baseline: Driven) -> None:
    entries = recorded(baseline.log)
    by_transition: dict[tuple[int, int], list[ProtocolStep]] = {}
    for step in steps_of(baseline.log):
        if step.direction is not None:
            by_transition.setdefault((step.seq, step.decision), []).append(step.step)
    to_train = [
        ProtocolStep.STOP_ACCEPTING,
        ProtocolStep.RESERVE_CAPACITY,
        ProtocolStep.UPDATE_ROUTING,
        ProtocolStep.CANCEL_AND_RETRY,
        ProtocolStep.RELEASE_ROLLOUT_MEMORY,
        ProtocolStep.RESTORE_TRAINING_STATE,
    ]
    to_rollout = [ProtocolStep.RELEASE_TRAINING_MEMORY, ProtocolStep.RESTORE_ROLLOUT_ENGINE]
    seen = set()
    for (seq, index), kinds in by_transition.items():
        decision = entries[seq].decisions[index]
        assert isinstance(decision, BeginTransition)
        if decision.direction is Direction.TO_TRAIN:
            # one reservation per destination engine (none when the cell held no executions)
            assert [k for k in kinds if k is not ProtocolStep.RESERVE_CAPACITY] == [
                k for k in to_train if k is not ProtocolStep.RESERVE_CAPACITY
            ]
            assert kinds.index(ProtocolStep.STOP_ACCEPTING) == 0
        else:
            assert kinds == to_rollout
        seen.add(decision.direction)
    assert seen == {Direction.TO_TRAIN, Direction.TO_ROLLOUT}


def test_role_changes_reach_the_cell_roles_projection(baseline: Driven) -> None:
    projections = lifecycle_projections()
    store = InMemoryProjectionStore({t.name: t for p in projections for t in p.tables})
    for projection in projections:
        catch_up(baseline.log, store, projection)
    rows = {row["cell_index"]: row["role"] for row in store.dump("gyre_cell_roles")}
    roles = baseline.controller.state().roles
    for cell, role in enumerate(roles):
        expected = {"rollout": "rollout", "train": "training"}.get(role.value, "transitioning")
        assert rows.get(cell, "rollout") == expected
    changes = [e.event for e in baseline.log.read() if isinstance(e.event, CellRoleChanged)]
    begins = [d for e in recorded(baseline.log) for d in e.decisions if isinstance(d, BeginTransition)]
    dones = [e for e in recorded(baseline.log) if isinstance(e.input, TransitionDone)]
    assert len(changes) == len(begins) + len(dones)
    counters = store.dump("gyre_counters")[0]
    state = baseline.controller.state().counters
    assert (counters["dispatched"], counters["started"]) == (state.d, state.p)


def test_a_refused_fact_is_recorded_and_skipped() -> None:
    log = InMemoryEventLog()
    cfg = tiny()
    ran = drive(log, cfg, steps=1)
    first_finished = next(e.input for e in recorded(log) if isinstance(e.input, ExecutionFinished))
    fact = fact_event(RUN, first_finished)
    assert fact is not None
    (duplicate,) = log.append([NewEvent(fact)])  # the same execution finishing twice
    inputs_before = ran.controller.inputs_recorded
    ran.controller.run_once()
    rejected = [e.event for e in log.read_stream(sched_stream(RUN)) if isinstance(e.event, SchedRejected)]
    assert len(rejected) == 1 and "not running" in rejected[0].reason
    assert ran.controller.inputs_recorded == inputs_before
    assert ran.controller.checkpoint == duplicate.position
    again = Controller(log, cfg, RecordingSink(), RUN, clock=lambda: 1e9)
    assert again.checkpoint == ran.controller.checkpoint
    assert replay_run(log, RUN).ok


def test_restart_with_another_config_is_refused(baseline: Driven) -> None:
    with pytest.raises(ConfigMismatchError):
        Controller(baseline.log, tiny(tau_s=11.0), RecordingSink(), RUN)


def test_a_second_writer_on_the_same_run_conflicts() -> None:
    log = InMemoryEventLog()
    cfg = tiny()
    first_sink, second_sink = RecordingSink(), RecordingSink()
    first = Controller(log, cfg, first_sink, RUN, clock=lambda: 0.0)
    second = Controller(log, cfg, second_sink, RUN, clock=lambda: 0.0)
    started = catalog.RunStarted(
        run_id=RUN, harness="h", model="m", group_size=2, batch_groups=4, cells=4, cell_capacity=8
    )
    log.append([NewEvent(started)])
    first.run_once()
    with pytest.raises(ControllerConflictError):
        second.run_once()
    assert second.inputs_recorded == 0
    assert first_sink.names() == ["dispatch_groups", "start_executions"]
    assert second_sink.names() == []


def test_plan_keeps_a_transition_with_its_reroute() -> None:
    begin = BeginTransition(5.0, 1, Direction.TO_TRAIN, 10, 32, 8, 2)
    from gyre_sched import Reroute

    reroute = Reroute(5.0, 1, (Placement(3, 3), Placement(4, 2), Placement(5, 3)))
    plan = plan_commands([DispatchGroups(5.0, 0, 1, 2, 0, 2), begin, reroute])
    assert [c.step for c in plan] == [
        ProtocolStep.DISPATCH_GROUPS,
        ProtocolStep.STOP_ACCEPTING,
        ProtocolStep.RESERVE_CAPACITY,
        ProtocolStep.RESERVE_CAPACITY,
        ProtocolStep.UPDATE_ROUTING,
        ProtocolStep.CANCEL_AND_RETRY,
        ProtocolStep.RELEASE_ROLLOUT_MEMORY,
        ProtocolStep.RESTORE_TRAINING_STATE,
    ]
    assert [c.decision for c in plan] == [0, 1, 1, 1, 1, 1, 1, 1]
    assert [(c.engine, c.count) for c in plan if c.step is ProtocolStep.RESERVE_CAPACITY] == [(2, 1), (3, 2)]
    sink = RecordingSink()
    for command in plan:
        command.call(sink)
    assert sink.names() == [c.step.value for c in plan]
    with pytest.raises(InputOrderError):
        plan_commands([begin])


def test_run_follows_the_log_until_stopped() -> None:
    log = InMemoryEventLog()
    clock = FakeClock()
    sink = RecordingSink()
    controller = Controller(log, tiny(), sink, RUN, clock=clock)
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), kwargs={"poll_s": 0.02})
    thread.start()
    try:
        started = catalog.RunStarted(
            run_id=RUN, harness="h", model="m", group_size=2, batch_groups=4, cells=4, cell_capacity=8
        )
        log.append([NewEvent(started)])
        for _ in range(200):
            if controller.inputs_recorded:
                break
            threading.Event().wait(0.01)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert controller.inputs_recorded == 1
    assert sink.names()[:2] == ["dispatch_groups", "start_executions"]
