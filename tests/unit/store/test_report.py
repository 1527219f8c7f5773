"""A run's report reads roles and transition times from the log: each step's roles at its start
(a fixed partition's cells in training from the run's start), each transition's phases and
its time from its first command to its last step; staleness both at dispatch and from the
versions the engines reported with each model call."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gyre_store import (
    BatchClosed,
    CellCommand,
    CellRole,
    CellRoleChanged,
    CellStep,
    CellStepDone,
    ExecutionDispatched,
    GroupConsumed,
    GroupDispatched,
    InMemoryEventLog,
    ModelCallRecorded,
    NewEvent,
    RunStarted,
    run_report,
)
from gyre_store.log import Event

RUN = "run-r"


class _Clock:
    """Each append one second after the one before."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def _log(*events: Event) -> InMemoryEventLog:
    log = InMemoryEventLog(clock=_Clock())
    for event in events:
        log.append([NewEvent(event)])
    return log


def _started(fixed: int) -> RunStarted:
    return RunStarted(
        run_id=RUN, harness="builtin", model="m", group_size=2, batch_groups=2, cells=2, cell_capacity=4,
        fixed_training_cells=fixed,
    )  # fmt: skip


def _role(cell: int, role: CellRole, previous: CellRole) -> CellRoleChanged:
    return CellRoleChanged(run_id=RUN, cell_index=cell, role=role, previous=previous)


def _step(step: CellStep, seconds: float, batch: int | None = None) -> CellStepDone:
    return CellStepDone(run_id=RUN, cell_index=0, step=step, transition=4, seconds=seconds, batch=batch)


def test_a_fixed_partitions_cells_train_from_the_start() -> None:
    report = run_report(_log(_started(fixed=1), BatchClosed(run_id=RUN, step=0)), RUN, phi=1.0, mu=1)
    assert report.steps[0].roles == {"rollout": 1, "training": 1}
    assert [(s.cell, s.role) for s in report.role_timeline] == [(0, "training"), (1, "rollout")]


def test_roles_at_each_steps_start_and_a_transitions_phases() -> None:
    command = CellCommand(run_id=RUN, cell_index=0, step=CellStep.DRAIN, transition=4)
    log = _log(
        _started(fixed=0),  # t = 1
        BatchClosed(run_id=RUN, step=0),  # t = 2: step 0 began with both cells in rollout
        _role(0, CellRole.TRANSITIONING, CellRole.ROLLOUT),  # t = 3
        command,  # t = 4: the transition's first command
        _step(CellStep.DRAIN, 0.0),
        _step(CellStep.REROUTE, 0.25),
        _step(CellStep.RELEASE, 0.5),
        _step(CellStep.RESTORE, 0.0),
        _role(0, CellRole.TRAINING, CellRole.TRANSITIONING),
        _step(CellStep.JOIN, 0.75, batch=1),  # t = 10
        BatchClosed(run_id=RUN, step=1),  # t = 11
        BatchClosed(run_id=RUN, step=2),  # t = 12: step 2 began with cell 0 in training
    )
    report = run_report(log, RUN, phi=0.5, mu=2)
    assert [s.roles for s in report.steps] == [{"rollout": 2}, {"rollout": 2}, {"rollout": 1, "training": 1}]
    [move] = report.transition_times
    assert (move.direction, move.cell, move.total_s) == ("to_training", 0, 6.0)  # t = 4 to t = 10
    assert move.phases == {"drain": 0.0, "reroute": 0.25, "release": 0.5, "restore": 0.0, "join": 0.75}
    assert [(s.cell, s.role, s.start_s, s.end_s) for s in report.role_timeline if s.cell == 0] == [
        (0, "rollout", 0.0, 2.0),
        (0, "transitioning", 2.0, 8.0),
        (0, "training", 8.0, 11.0),
    ]


def _call(execution: str, request: str, versions: tuple[tuple[int, int], ...]) -> ModelCallRecorded:
    return ModelCallRecorded(execution_id=execution, run_id=RUN, request_id=request, weight_versions=versions)


def test_staleness_at_dispatch_and_from_the_engines_reported_versions() -> None:
    log = _log(
        _started(fixed=0),
        GroupDispatched(group_id="g0", run_id=RUN, query_id="q0", size=2, policy_version=0),
        ExecutionDispatched(execution_id="e0", run_id=RUN, group_id="g0", policy_version=0),
        ExecutionDispatched(execution_id="e1", run_id=RUN, group_id="g0", policy_version=0),
        GroupDispatched(group_id="g1", run_id=RUN, query_id="q1", size=1, policy_version=1),
        ExecutionDispatched(execution_id="e2", run_id=RUN, group_id="g1", policy_version=1),
        ExecutionDispatched(execution_id="e3", run_id=RUN, group_id="g9", policy_version=1),  # never consumed
        _call("e0", "r0", ((0, 0),)),  # sampled on version 0
        _call("e0", "r1", ((0, 1), (5, 2))),  # a publication mid-call: its oldest version counts
        _call("e1", "r2", ()),  # the engine reported no version
        _call("e2", "r3", ((0, 2),)),
        _call("e3", "r4", ((0, 0),)),  # its group was not consumed: not counted
        GroupConsumed(group_id="g0", run_id=RUN, step=2),
        GroupConsumed(group_id="g1", run_id=RUN, step=3),
        BatchClosed(run_id=RUN, step=2),
        BatchClosed(run_id=RUN, step=3),
    )
    st = run_report(log, RUN, phi=1.0, mu=2).staleness
    assert (st.measured_mean, st.groups, st.histogram) == (2.0, 2, {"2": 2})  # 2 - 0 and 3 - 1
    assert st.expected_mean == 1.5
    # Per call: 2 - 0, 2 - 1, 3 - 2; e1's call reported nothing.
    assert (st.engine_calls, st.unreported_calls) == (3, 1)
    assert st.engine_mean == 4 / 3
    assert st.engine_histogram == {"1": 2, "2": 1}
