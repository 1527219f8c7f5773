"""The decision core, scripted input by input on a tiny cluster."""

from __future__ import annotations

import pytest

from gyre_sched import (
    POOL,
    BatchClosed,
    BatchStarted,
    BeginTransition,
    ClockTick,
    CoreAtBurstEnd,
    Decision,
    DecisionCore,
    Direction,
    DispatchGroups,
    ExecutionFinished,
    GroupClaimed,
    GroupReady,
    InputOrderError,
    PolicyKind,
    RequestTick,
    Reroute,
    RunStarted,
    StartExecutions,
    TransitionDone,
    WeightsPublished,
)
from gyre_sched.decision import CellRole
from tests.unit.sched.helpers import tiny


def _of(decisions: tuple[Decision, ...], kind: type) -> list:  # type: ignore[type-arg]
    return [d for d in decisions if isinstance(d, kind)]


def _started_core(**changes: object) -> tuple[DecisionCore, tuple[Decision, ...]]:
    core = DecisionCore(tiny(**changes))
    return core, core.handle(RunStarted(0.0))


def test_initial_dispatch_fills_target_depth_and_starts_what_fits() -> None:
    _, out = _started_core(phi=1.5, mu=2)  # (1.5 + 2) * 4 = 14 groups, 28 executions
    (dispatch,) = _of(out, DispatchGroups)
    assert (dispatch.first_group, dispatch.groups, dispatch.d_after, dispatch.version) == (0, 14, 28, 0)
    (start,) = _of(out, StartExecutions)
    assert start.p_after == 28 and len(start.placements) == 28
    # highest cell index first: the core is the first to leave rollout
    assert [p.engine for p in start.placements[:8]] == [3] * 8
    assert [p.engine for p in start.placements[24:]] == [0] * 4


def test_starts_are_capped_by_capacity() -> None:
    core, out = _started_core(phi=2.5, mu=2)  # 18 groups = 36 executions > 32 slots
    (start,) = _of(out, StartExecutions)
    assert len(start.placements) == 32
    assert core.state().counters.queued == 4
    more = core.handle(ExecutionFinished(1.0, 0))
    (start,) = _of(more, StartExecutions)
    assert [(p.execution, p.engine) for p in start.placements] == [(32, 3)]


def _core_ready_to_join() -> DecisionCore:
    core, _ = _started_core(phi=1.5, mu=2)
    core.handle(BatchStarted(0.0, 0))
    for execution in range(4):  # groups 0 and 1, on cell 3
        core.handle(ExecutionFinished(1.0, execution))
    core.handle(GroupReady(1.0, 0))
    return core


def test_supply_timer_then_core_first_transition_with_reroute() -> None:
    core = _core_ready_to_join()
    out = core.handle(GroupReady(2.0, 1))  # supply 2 = rho_min B; w = 24 <= 32 - 8
    assert out == (RequestTick(2.0, 12.0),)
    assert core.handle(ClockTick(11.9)) == ()
    out = core.handle(ClockTick(12.0))
    begin, reroute = out
    assert isinstance(begin, BeginTransition) and isinstance(reroute, Reroute)
    assert (begin.cell, begin.direction, begin.w, begin.c_r, begin.c_e, begin.k_after) == (
        0,
        Direction.TO_TRAIN,
        24,
        32,
        8,
        1,
    )
    # the core's four executions go to the highest-index rollout cell with room
    assert sorted((m.execution, m.engine) for m in reroute.moves) == [(e, 3) for e in range(24, 28)]
    assert core.state().roles[0] is CellRole.TO_TRAIN


def test_supply_drop_resets_the_timer() -> None:
    core = _core_ready_to_join()
    core.handle(GroupReady(2.0, 1))
    core.handle(GroupClaimed(5.0, 0, 0))  # supply falls to 1 < 2
    core.handle(GroupReady(6.0, 2))  # back to 2: the timer restarts at 6
    assert core.handle(ClockTick(12.0)) == ()
    out = core.handle(ClockTick(16.0))
    assert isinstance(out[0], BeginTransition)


def test_waterlevel_blocks_the_next_cell_and_transitions_are_serial() -> None:
    core = _core_ready_to_join()
    core.handle(GroupReady(2.0, 1))
    core.handle(ClockTick(12.0))  # core begins
    assert core.handle(GroupReady(13.0, 2)) == ()  # in flight: nothing else may begin
    out = core.handle(TransitionDone(20.52, 0))
    assert core.state().roles[0] is CellRole.TRAIN
    # w = 24 > C_R - C_e = 24 - 8: cell 1 must wait
    assert not _of(out, BeginTransition)
    assert not _of(core.handle(ClockTick(40.0)), BeginTransition)
    begins = []
    for execution in range(4, 12):  # eight more finish; supply has held since 20.52
        begins += _of(core.handle(ExecutionFinished(41.0 + execution, execution)), BeginTransition)
    (begin,) = begins  # on the eighth finish, w = 16 <= C_R - C_e = 16
    assert (begin.at, begin.cell, begin.w, begin.c_r) == (52.0, 1, 16, 24)


def test_burst_end_satellites_return_and_core_decision() -> None:
    core, _ = _started_core(phi=0.5, mu=1, rho_min=0.25)  # 6 groups, 12 executions
    core.handle(BatchStarted(0.0, 0))
    for execution in range(12):
        core.handle(ExecutionFinished(1.0, execution))
    for group in range(6):
        core.handle(GroupReady(1.0, group))
    for t, cell in ((11.0, 0), (30.0, 1)):
        assert isinstance(core.handle(ClockTick(t))[0], BeginTransition)
        core.handle(TransitionDone(t + 8.52, cell))
    for group in range(4):
        core.handle(GroupClaimed(50.0, group, 0))
    out = core.handle(BatchClosed(60.0, 0))
    (ret,) = _of(out, BeginTransition)
    assert (ret.cell, ret.direction) == (1, Direction.TO_ROLLOUT)
    out = core.handle(WeightsPublished(70.0, 1))
    (decision,) = _of(out, CoreAtBurstEnd)
    # w = 0, mu N B = 8 <= 0 + 3 * 8 and 2 ready >= ceil(0.25 * 4): the core stays
    assert decision.stays and (decision.w, decision.incoming, decision.capacity) == (0, 8, 24)
    (dispatch,) = _of(out, DispatchGroups)
    assert (dispatch.first_group, dispatch.groups, dispatch.version) == (6, 4, 1)
    assert core.state().roles[0] is CellRole.TRAIN


def test_core_returns_without_ready_supply() -> None:
    core, _ = _started_core(phi=0.0, mu=1, rho_min=1.0)
    core.handle(BatchStarted(0.0, 0))
    for execution in range(8):
        core.handle(ExecutionFinished(1.0, execution))
    for group in range(4):
        core.handle(GroupReady(1.0, group))
    core.handle(ClockTick(11.0))
    core.handle(TransitionDone(20.0, 0))
    for group in range(4):
        core.handle(GroupClaimed(30.0, group, 0))
    core.handle(BatchClosed(40.0, 0))
    out = core.handle(WeightsPublished(50.0, 1))
    decision, begin = out[0], out[1]
    assert isinstance(decision, CoreAtBurstEnd) and not decision.stays
    assert isinstance(begin, BeginTransition) and begin.direction is Direction.TO_ROLLOUT and begin.cell == 0


def test_reroute_prefers_the_pool() -> None:
    core = DecisionCore(tiny(pool_capacity=8, phi=1.5, mu=2))  # 28 executions: pool 8, cells 3, 2 full, 1: 4
    core.handle(RunStarted(0.0))
    core.handle(BatchStarted(0.0, 0))
    for execution in range(4):  # frees 4 slots in the pool
        core.handle(ExecutionFinished(1.0, execution))
    core.handle(GroupReady(1.0, 0))
    core.handle(GroupReady(1.0, 1))
    out = core.handle(ClockTick(11.0))
    begin = out[0]
    assert isinstance(begin, BeginTransition) and begin.cell == 0
    (reroute,) = _of(out, Reroute)
    assert reroute.moves == ()  # the core had nothing: it was filled last
    core.handle(TransitionDone(20.0, 0))
    for execution in range(4, 12):
        core.handle(ExecutionFinished(21.0, execution))
    out = core.handle(ClockTick(31.0))
    (reroute,) = _of(out, Reroute)
    assert reroute.source == 1
    # cell 1's four executions: the pool has 8 free, cell 3 has 4; the pool wins
    assert [(m.execution, m.engine) for m in reroute.moves] == [(e, POOL) for e in range(24, 28)]


def test_async_never_moves_cells() -> None:
    core = DecisionCore(tiny(PolicyKind.ASYNC))
    assert core.state().roles == (CellRole.TRAIN, CellRole.TRAIN)
    out = core.handle(RunStarted(0.0))
    (start,) = _of(out, StartExecutions)
    assert {p.engine for p in start.placements} == {POOL}
    core.handle(BatchStarted(0.0, 0))
    for group in range(10):
        core.handle(GroupReady(1.0, group))
    assert not _of(core.handle(ClockTick(100.0)), BeginTransition)


def test_colocate_waits_until_the_pool_alone_holds_the_waterlevel() -> None:
    core = DecisionCore(tiny(PolicyKind.COLOCATE, pool_capacity=4, phi=0.0, mu=1))  # 8 executions
    core.handle(RunStarted(0.0))
    core.handle(BatchStarted(0.0, 0))
    for execution in range(2):
        core.handle(ExecutionFinished(1.0, execution))
    core.handle(GroupReady(1.0, 0))
    core.handle(ExecutionFinished(1.0, 2))
    core.handle(ExecutionFinished(1.0, 3))
    core.handle(GroupReady(1.0, 1))
    # w = 4 <= C_s = 4 only now; elastic would have gone at w <= 28
    assert core.handle(ClockTick(11.0))[0] == BeginTransition(11.0, 0, Direction.TO_TRAIN, 4, 36, 8, 1)


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        ([GroupReady(0.0, 0)], "before RunStarted"),
        ([RunStarted(0.0), RunStarted(1.0)], "twice"),
        ([RunStarted(5.0), ClockTick(4.0)], "time order"),
        ([RunStarted(0.0), ExecutionFinished(1.0, 999)], "not running"),
        ([RunStarted(0.0), TransitionDone(1.0, 2)], "never began"),
        ([RunStarted(0.0), BatchStarted(0.0, 0), GroupClaimed(1.0, 0, 0)], "no ready"),
        ([RunStarted(0.0), BatchClosed(1.0, 0)], "open batch"),
    ],
)
def test_contradictory_inputs_are_refused(inputs: list, words: str) -> None:  # type: ignore[type-arg]
    core = DecisionCore(tiny())
    with pytest.raises(InputOrderError, match=words):
        for event in inputs:
            core.handle(event)
