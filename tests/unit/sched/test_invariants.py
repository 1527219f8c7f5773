"""The invariant checker: clean on simulated runs, and able to catch each violation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_sched import (
    POOL,
    BeginTransition,
    ClockTick,
    Direction,
    DispatchGroups,
    ExecutionFinished,
    GroupClaimed,
    Placement,
    PolicyKind,
    Reroute,
    RunStarted,
    StartExecutions,
    TransitionDone,
    ViolationKind,
    check_log,
    get_preset,
    simulate,
)
from gyre_sched.sim import WORKLOADS
from tests.unit.sched.helpers import small_cluster, tiny


@pytest.mark.parametrize("name", ["smoke", "ablation-E0", "ablation-E1", "ablation-C2", "ablation-A0"])
def test_simulated_presets_are_clean(name: str) -> None:
    preset = get_preset(name)
    run = simulate(preset.sched, preset.cluster, WORKLOADS[preset.workload], steps=6, seed=11, keep_log=True)
    assert check_log(preset.sched, run.log) == []
    assert any(isinstance(d, BeginTransition) for e in run.log for d in e.decisions) or name == "ablation-A0"


@settings(max_examples=15)
@given(
    policy=st.sampled_from(list(PolicyKind)),
    phi_halves=st.integers(0, 4),
    mu=st.integers(1, 3),
    rho=st.sampled_from([0.25, 0.5, 1.0]),
    streaming=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_random_small_runs_are_clean(
    policy: PolicyKind, phi_halves: int, mu: int, rho: float, streaming: bool, seed: int
) -> None:
    cfg = tiny(policy, phi=phi_halves / 2, mu=mu, rho_min=rho)
    run = simulate(
        cfg, small_cluster(streaming), WORKLOADS["nl2repo-122b"], steps=4, seed=seed, keep_log=True
    )
    assert check_log(cfg, run.log) == []


def _base() -> list:  # type: ignore[type-arg]
    # 2 groups of 2 dispatched and started: executions 0, 1 on cell 3; 2, 3 on cell 0
    return [
        RunStarted(0.0),
        DispatchGroups(0.0, 0, 2, 2, 0, 4),
        StartExecutions(0.0, (Placement(0, 3), Placement(1, 3), Placement(2, 0), Placement(3, 0)), 4),
    ]


def _kinds(log: list) -> set[ViolationKind]:  # type: ignore[type-arg]
    return {v.kind for v in check_log(tiny(), log)}


def test_hand_made_clean_log() -> None:
    log = [
        *_base(),
        BeginTransition(1.0, 0, Direction.TO_TRAIN, 4, 32, 8, 1),
        Reroute(1.0, 0, (Placement(2, 3), Placement(3, 2))),
        TransitionDone(9.0, 0),
    ]
    assert _kinds(log) == set()


def test_catches_transition_above_the_waterlevel() -> None:
    log = [
        RunStarted(0.0),
        DispatchGroups(0.0, 0, 14, 2, 0, 28),
        BeginTransition(1.0, 0, Direction.TO_TRAIN, 28, 32, 8, 1),
        Reroute(1.0, 0, ()),
    ]
    assert ViolationKind.WATERLEVEL in _kinds(log)


def test_catches_overlapping_transitions() -> None:
    log = [
        *_base(),
        BeginTransition(1.0, 0, Direction.TO_TRAIN, 4, 32, 8, 1),
        Reroute(1.0, 0, (Placement(2, 3), Placement(3, 2))),
        BeginTransition(2.0, 1, Direction.TO_TRAIN, 4, 24, 8, 2),
        Reroute(2.0, 1, ()),
    ]
    assert ViolationKind.NOT_SERIAL in _kinds(log)


def test_catches_a_satellite_before_the_core() -> None:
    log = [*_base(), BeginTransition(1.0, 2, Direction.TO_TRAIN, 4, 32, 8, 1), Reroute(1.0, 2, ())]
    assert _kinds(log) == {ViolationKind.NOT_CORE_FIRST}


def test_catches_executions_left_behind() -> None:
    log = [
        *_base(),
        BeginTransition(1.0, 0, Direction.TO_TRAIN, 4, 32, 8, 1),
        Reroute(1.0, 0, (Placement(2, 3),)),
    ]
    assert _kinds(log) == {ViolationKind.ORPHANED}
    log = [*_base(), BeginTransition(1.0, 0, Direction.TO_TRAIN, 4, 32, 8, 1), ClockTick(2.0)]
    assert _kinds(log) == {ViolationKind.ORPHANED}


def test_catches_a_cell_holding_both_roles() -> None:
    log = [
        *_base(),
        BeginTransition(1.0, 0, Direction.TO_TRAIN, 4, 32, 8, 1),
        Reroute(1.0, 0, (Placement(2, 3), Placement(3, 2))),
        TransitionDone(9.0, 0),
        StartExecutions(10.0, (), 4),
        DispatchGroups(10.0, 2, 1, 2, 0, 6),
        StartExecutions(10.0, (Placement(4, 0),), 5),
    ]
    assert _kinds(log) == {ViolationKind.BOTH_ROLES}


def test_catches_an_overfull_engine() -> None:
    placements = tuple(Placement(e, POOL) for e in range(4))
    cfg = tiny(pool_capacity=2)
    log = [RunStarted(0.0), DispatchGroups(0.0, 0, 2, 2, 0, 4), StartExecutions(0.0, placements, 4)]
    assert {v.kind for v in check_log(cfg, log)} == {ViolationKind.OVER_CAPACITY}


def test_catches_counters_going_down_or_crossing() -> None:
    log = [*_base(), DispatchGroups(1.0, 2, 1, 2, 0, 3)]
    assert ViolationKind.COUNTER in _kinds(log)
    log = [*_base(), StartExecutions(1.0, (), 3)]
    assert ViolationKind.COUNTER in _kinds(log)
    log = [*_base(), *(ExecutionFinished(1.0, e) for e in range(4)), ExecutionFinished(2.0, 0)]
    assert ViolationKind.COUNTER in _kinds(log)


def test_catches_negative_staleness_and_groups_consumed_twice_or_never_dispatched() -> None:
    # B = 4; the packer takes ready groups oldest version first, so a group of the first
    # wave may be consumed at any later step (a straggler), but never before its version
    log = [RunStarted(0.0), DispatchGroups(0.0, 0, 4, 2, 0, 8), GroupClaimed(1.0, 3, 0)]
    assert _kinds(log) == set()
    log = [RunStarted(0.0), DispatchGroups(0.0, 0, 4, 2, 0, 8), GroupClaimed(1.0, 3, 5)]
    assert _kinds(log) == set()
    log = [RunStarted(0.0), DispatchGroups(0.0, 0, 4, 2, 2, 8), GroupClaimed(1.0, 3, 1)]
    assert _kinds(log) == {ViolationKind.STALENESS}
    log = [RunStarted(0.0), DispatchGroups(0.0, 0, 4, 2, 0, 8), GroupClaimed(1.0, 9, 0)]
    assert _kinds(log) == {ViolationKind.STALENESS}
    log = [
        RunStarted(0.0),
        DispatchGroups(0.0, 0, 4, 2, 0, 8),
        GroupClaimed(1.0, 3, 0),
        GroupClaimed(2.0, 3, 1),
    ]
    assert _kinds(log) == {ViolationKind.STALENESS}
