"""The discrete-event cluster simulator: the same decision core driven by simulated
executions, training steps and transitions; workload models, the paper's presets and
tables, and plots. Simulation only: nothing here runs on a live cluster.
"""

from __future__ import annotations

from gyre_sched.sim.cluster import ClusterConfig
from gyre_sched.sim.plots import role_timeline, steps_and_speedup, waterlevel
from gyre_sched.sim.presets import ABLATION, PRESETS, SPEEDUP, WORKLOADS, Preset, get_preset, with_policy
from gyre_sched.sim.results import SimResult, TransitionRecord, cumulative_speedup
from gyre_sched.sim.simulator import SimCluster, SimRun, simulate
from gyre_sched.sim.tables import ablation_table, speedup_table
from gyre_sched.sim.training import (
    BroadcastDone,
    EventQueue,
    MicrostepDone,
    PublishDone,
    ReadyPool,
    Trainer,
    UpdateDone,
)
from gyre_sched.sim.workload import (
    CeilingLogNormal,
    EmpiricalWorkload,
    GroupSample,
    WorkloadModel,
    workload_stats,
)
from gyre_sched.sim.workload_file import load_workload, parse_workload
from gyre_sched.sim.workload_store import workload_from_run

__all__ = [
    "ABLATION",
    "PRESETS",
    "SPEEDUP",
    "WORKLOADS",
    "BroadcastDone",
    "CeilingLogNormal",
    "ClusterConfig",
    "EmpiricalWorkload",
    "EventQueue",
    "GroupSample",
    "MicrostepDone",
    "Preset",
    "PublishDone",
    "ReadyPool",
    "SimCluster",
    "SimResult",
    "SimRun",
    "Trainer",
    "TransitionRecord",
    "UpdateDone",
    "WorkloadModel",
    "ablation_table",
    "cumulative_speedup",
    "get_preset",
    "load_workload",
    "parse_workload",
    "role_timeline",
    "simulate",
    "speedup_table",
    "steps_and_speedup",
    "waterlevel",
    "with_policy",
    "workload_from_run",
    "workload_stats",
]
