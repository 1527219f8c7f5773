"""The decision core on a live run's log: the controller (facts in, decisions recorded,
commands carried out through a ``CommandSink``), the scheduler's own ``sched.*`` events,
and the replay that re-derives a recorded run's decisions and checks its invariants.

Holds no serving or training code: what carries a command out is the sink's business.
"""

from __future__ import annotations

from gyre_sched.live.capacity import RegisteredPool
from gyre_sched.live.controller import Clock, Command, Controller, ControllerView, plan_commands
from gyre_sched.live.events import (
    FACT_TYPES,
    SCHED_EVENT_TYPES,
    ProtocolStep,
    SchedConfigured,
    SchedDecision,
    SchedInput,
    SchedRejected,
    SchedStep,
    engine_name,
    engine_number,
    execution_id,
    fact_event,
    group_id,
    input_of,
    register_sched_events,
    sched_stream,
)
from gyre_sched.live.metrics import ControllerCollector, MetricsServer
from gyre_sched.live.replay import (
    DecisionDiff,
    DiffKind,
    Disagreement,
    RecordedRun,
    ReplayReport,
    check_lifecycle,
    compare,
    load_run,
    replay_run,
)
from gyre_sched.live.sink import LiveSink, TaskDeck

__all__ = [
    "FACT_TYPES",
    "SCHED_EVENT_TYPES",
    "Clock",
    "Command",
    "Controller",
    "ControllerCollector",
    "ControllerView",
    "DecisionDiff",
    "DiffKind",
    "Disagreement",
    "LiveSink",
    "MetricsServer",
    "ProtocolStep",
    "RecordedRun",
    "RegisteredPool",
    "ReplayReport",
    "SchedConfigured",
    "SchedDecision",
    "SchedInput",
    "SchedRejected",
    "SchedStep",
    "TaskDeck",
    "check_lifecycle",
    "compare",
    "engine_name",
    "engine_number",
    "execution_id",
    "fact_event",
    "group_id",
    "input_of",
    "load_run",
    "plan_commands",
    "register_sched_events",
    "replay_run",
    "sched_stream",
]
