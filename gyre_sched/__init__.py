"""gyre_sched: the scheduling plane as pure decisions, and the cluster simulator that drives them.

The decision core (``SchedulerCore``) turns typed inputs into typed decisions; the
simulator, a replay of the event log and the live controller all drive that one core.
"""

from __future__ import annotations

from gyre_sched.cluster import ClusterConfig
from gyre_sched.codec import (
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
from gyre_sched.commands import CommandSink, carry_out
from gyre_sched.config import PolicyKind, SchedConfig, dispatch_params, mean_staleness
from gyre_sched.core import CoreState, SchedulerCore, run_core
from gyre_sched.counters import Counters
from gyre_sched.decisions import (
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
from gyre_sched.exceptions import (
    CapacityBelowBatchError,
    CellCountError,
    ConfigError,
    CounterDecreaseError,
    GyreSchedError,
    InputOrderError,
    NegativeOverheadError,
    RhoMinError,
    StalenessError,
    UnknownPresetError,
    WorkloadError,
    WorkloadFileError,
)
from gyre_sched.inputs import (
    BatchClosed,
    BatchStarted,
    ClockTick,
    ExecutionFinished,
    GroupClaimed,
    GroupReady,
    Input,
    Outcome,
    RunStarted,
    TransitionDone,
    WeightsPublished,
)
from gyre_sched.invariants import Violation, ViolationKind, check_log
from gyre_sched.ledger import core_may_stay, may_join, rollout_capacity, startable, supply
from gyre_sched.policy import AsyncPolicy, CellRole, ColocatePolicy, ElasticPolicy, Policy, policy_for
from gyre_sched.presets import PRESETS, WORKLOADS, Preset, get_preset
from gyre_sched.results import SimResult, TransitionRecord, cumulative_speedup
from gyre_sched.routing import assign, destination_order
from gyre_sched.simulator import SimRun, simulate
from gyre_sched.workload import (
    CeilingLogNormal,
    EmpiricalWorkload,
    GroupSample,
    WorkloadModel,
    workload_stats,
)
from gyre_sched.workload_file import load_workload, parse_workload

__all__ = [
    "POOL",
    "PRESETS",
    "WORKLOADS",
    "AsyncPolicy",
    "BatchClosed",
    "BatchStarted",
    "BeginTransition",
    "CapacityBelowBatchError",
    "CeilingLogNormal",
    "CellCountError",
    "CellRole",
    "ClockTick",
    "ClusterConfig",
    "ColocatePolicy",
    "CommandSink",
    "ConfigError",
    "CoreAtBurstEnd",
    "CoreState",
    "CounterDecreaseError",
    "Counters",
    "Decision",
    "Direction",
    "DispatchGroups",
    "ElasticPolicy",
    "EmpiricalWorkload",
    "ExecutionFinished",
    "GroupClaimed",
    "GroupReady",
    "GroupSample",
    "GyreSchedError",
    "Input",
    "InputOrderError",
    "LogEntry",
    "NegativeOverheadError",
    "Outcome",
    "Placement",
    "Policy",
    "PolicyKind",
    "Preset",
    "RequestTick",
    "Reroute",
    "RhoMinError",
    "RunStarted",
    "SchedConfig",
    "SchedulerCore",
    "SimResult",
    "SimRun",
    "StalenessError",
    "StartExecutions",
    "TransitionDone",
    "TransitionRecord",
    "UnknownPresetError",
    "Violation",
    "ViolationKind",
    "WeightsPublished",
    "WorkloadError",
    "WorkloadFileError",
    "WorkloadModel",
    "assign",
    "carry_out",
    "check_log",
    "core_may_stay",
    "cumulative_speedup",
    "decision_from_dict",
    "decode_decision",
    "decode_input",
    "decode_log",
    "destination_order",
    "dispatch_params",
    "encode",
    "encode_log",
    "get_preset",
    "input_from_dict",
    "load_workload",
    "may_join",
    "mean_staleness",
    "parse_workload",
    "policy_for",
    "rollout_capacity",
    "run_core",
    "simulate",
    "startable",
    "supply",
    "to_dict",
    "workload_stats",
]
