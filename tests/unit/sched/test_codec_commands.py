"""JSON round trips, replay determinism and the command order of a transition."""

from __future__ import annotations

import msgspec

from gyre_sched import (
    POOL,
    BeginTransition,
    CoreAtBurstEnd,
    Direction,
    DispatchGroups,
    ExecutionFinished,
    Outcome,
    Placement,
    RequestTick,
    Reroute,
    StartExecutions,
    carry_out,
    decision_from_dict,
    decode_decision,
    decode_input,
    decode_log,
    encode,
    encode_log,
    get_preset,
    input_from_dict,
    run_decisions,
    simulate,
    to_dict,
)
from gyre_sched.decision import DECISION_TYPES, INPUT_TYPES
from gyre_sched.sim import WORKLOADS
from gyre_sched.testing import RecordingSink

DECISIONS = [
    DispatchGroups(1.0, 0, 10, 16, 0, 160),
    StartExecutions(1.0, (Placement(3, POOL), Placement(4, 2)), 5),
    BeginTransition(2.5, 1, Direction.TO_TRAIN, 100, 400, 144, 2),
    Reroute(2.5, 1, (Placement(7, 3),)),
    CoreAtBurstEnd(3.0, False, 12, 1536, 1008, 3, 8),
    RequestTick(3.0, 63.0),
]


def test_every_input_type_round_trips() -> None:
    for kind in INPUT_TYPES:
        fields = {name: 1 for name in kind.__struct_fields__}
        fields["at"] = 1.5
        if "outcome" in fields:
            fields["outcome"] = Outcome.OVERALL_TIMEOUT
        event = kind(**fields)
        assert decode_input(encode(event)) == event
        assert input_from_dict(to_dict(event)) == event
    assert b'"overall_timeout"' in encode(ExecutionFinished(1.0, 2, Outcome.OVERALL_TIMEOUT))


def test_every_decision_type_round_trips() -> None:
    assert {type(d) for d in DECISIONS} == set(DECISION_TYPES)
    for decision in DECISIONS:
        assert decode_decision(encode(decision)) == decision
        assert decision_from_dict(to_dict(decision)) == decision
        assert to_dict(decision)["type"] == type(decision).__name__


def test_simulated_run_replays_identically_from_json() -> None:
    preset = get_preset("smoke")
    run = simulate(preset.sched, preset.cluster, WORKLOADS[preset.workload], steps=3, seed=7, keep_log=True)
    restored = decode_log(encode_log(run.log))
    assert restored == run.log
    replayed = run_decisions(preset.sched, [entry.input for entry in restored])
    assert [e.decisions for e in replayed] == [e.decisions for e in run.log]
    assert any(e.decisions for e in replayed)


def test_same_seed_same_run_other_seed_other_run() -> None:
    preset = get_preset("smoke")
    a, b, c = (
        simulate(preset.sched, preset.cluster, WORKLOADS[preset.workload], steps=3, seed=s, keep_log=True)
        for s in (1, 1, 2)
    )
    assert a.log == b.log and a.result == b.result
    assert a.result.step_end_s != c.result.step_end_s


def test_transition_commands_in_the_papers_order() -> None:
    sink = RecordingSink()
    moves = (Placement(7, POOL), Placement(8, 3), Placement(9, 3))
    carry_out([BeginTransition(1.0, 1, Direction.TO_TRAIN, 1, 2, 3, 1), Reroute(1.0, 1, moves)], sink)
    assert sink.names() == [
        "stop_accepting",
        "reserve_capacity",
        "reserve_capacity",
        "update_routing",
        "cancel_and_retry",
        "release_rollout_memory",
        "restore_training_state",
    ]
    assert sink.calls[1:3] == [("reserve_capacity", (POOL, 1)), ("reserve_capacity", (3, 2))]
    sink = RecordingSink()
    carry_out([BeginTransition(9.0, 1, Direction.TO_ROLLOUT, 1, 2, 3, 0), RequestTick(9.0, 20.0)], sink)
    assert sink.names() == ["release_training_memory", "restore_rollout_engine", "schedule_tick"]


def test_decisions_are_frozen() -> None:
    decision = DECISIONS[0]
    try:
        decision.groups = 3  # type: ignore[misc]
    except AttributeError:
        pass
    else:  # pragma: no cover - a mutable decision would break replay
        raise AssertionError("decisions must be immutable")
    assert msgspec.structs.replace(decision, groups=3).groups == 3
