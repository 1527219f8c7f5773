"""The decision core: the paper's scheduling rules as one deterministic state machine.

Typed inputs (facts) in, typed decisions out: counters d, p, f, the capacity ledger
(eq. 1), waterlevel and supply checks (eq. 2), boundary dispatch, the burst-end decision
about the core cell (eq. 3), reroute destinations, the three policies, and an independent
invariant checker. No I/O, no clock: the live controller, replay and the simulator drive it.
"""

from __future__ import annotations

from gyre_sched.decision.codec import (
    LogEntry,
    decision_from_dict,
    decode_decision,
    decode_input,
    decode_log,
    encode,
    encode_log,
    input_from_dict,
    to_dict,
)
from gyre_sched.decision.commands import CommandSink, KeyedSink, carry_out
from gyre_sched.decision.counters import Counters
from gyre_sched.decision.decisions import (
    DECISION_TYPES,
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
    INPUT_TYPES,
    BatchClosed,
    BatchStarted,
    ClockTick,
    ExecutionFinished,
    GroupClaimed,
    GroupReady,
    Input,
    Outcome,
    PoolCapacityChanged,
    RunStarted,
    TransitionDone,
    WeightsPublished,
)
from gyre_sched.decision.invariants import Violation, ViolationKind, check_log
from gyre_sched.decision.ledger import core_may_stay, may_join, rollout_capacity, startable, supply
from gyre_sched.decision.machine import DecisionCore, DecisionState, run_decisions
from gyre_sched.decision.policy import (
    AsyncPolicy,
    CellRole,
    ColocatePolicy,
    ElasticPolicy,
    Policy,
    policy_for,
)

__all__ = [
    "DECISION_TYPES",
    "INPUT_TYPES",
    "POOL",
    "AsyncPolicy",
    "BatchClosed",
    "BatchStarted",
    "BeginTransition",
    "CellRole",
    "ClockTick",
    "ColocatePolicy",
    "CommandSink",
    "CoreAtBurstEnd",
    "Counters",
    "Decision",
    "DecisionCore",
    "DecisionState",
    "Direction",
    "DispatchGroups",
    "ElasticPolicy",
    "ExecutionFinished",
    "GroupClaimed",
    "GroupReady",
    "Input",
    "KeyedSink",
    "LogEntry",
    "Outcome",
    "Placement",
    "Policy",
    "PoolCapacityChanged",
    "RequestTick",
    "Reroute",
    "RunStarted",
    "StartExecutions",
    "TransitionDone",
    "Violation",
    "ViolationKind",
    "WeightsPublished",
    "assign",
    "carry_out",
    "check_log",
    "core_may_stay",
    "decision_from_dict",
    "decode_decision",
    "decode_input",
    "decode_log",
    "destination_order",
    "encode",
    "encode_log",
    "input_from_dict",
    "may_join",
    "policy_for",
    "rollout_capacity",
    "run_decisions",
    "startable",
    "supply",
    "to_dict",
]
