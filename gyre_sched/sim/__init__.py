"""The discrete-event cluster simulator: the same decision core driven by simulated
executions, training steps and transitions; workload models, the paper's presets and
tables, and plots. Simulation only: nothing here runs on a live cluster.
"""

from __future__ import annotations

from gyre_sched.sim.cluster import ClusterConfig
from gyre_sched.sim.fit import (
    Calibration,
    CostFit,
    FigureFit,
    ProfileFit,
    ablation_loss,
    calibrate,
    fit_profile,
    planned_runs,
    profile,
    profile_draws,
    profile_loss,
    speedup_loss,
    with_costs,
)
from gyre_sched.sim.fit_check import Departure, check_presets
from gyre_sched.sim.measured import MeasuredCosts, measured_cluster, predict_run
from gyre_sched.sim.paper import PAPER_ABLATION, PAPER_SPEEDUP, PAPER_SPEEDUP_NOT_SIMULATED
from gyre_sched.sim.plots import role_timeline, steps_and_speedup, waterlevel
from gyre_sched.sim.presets import (
    ABLATION,
    PRESETS,
    SPEEDUP,
    TRAIN_NODE_HOURS_PER_GROUP_2_4T,
    TRAIN_NODE_HOURS_PER_GROUP_122B,
    WORKLOADS,
    Preset,
    get_preset,
    with_policy,
)
from gyre_sched.sim.results import SimResult, TransitionRecord, cumulative_speedup
from gyre_sched.sim.simulator import CoreDecider, Decider, SimCluster, SimRun, simulate
from gyre_sched.sim.split import (
    CHANGED_AFTER_SEEN_ROWS,
    CHANGED_AFTER_SEEN_SPEEDUPS,
    OUT_OF_FIT_ROWS,
    TRAINING_ROWS,
    TRAINING_SPEEDUPS,
    Role,
    ablation_role,
    speedup_role,
)
from gyre_sched.sim.tables import (
    ABLATION_NOTE,
    MET_TOLERANCE,
    SPEEDUP_NOTE,
    AblationRow,
    SpeedupRow,
    ablation_table,
    speedup_table,
)
from gyre_sched.sim.time_use import StepTimeUse, TimeUse, UseSeconds, format_account, seconds_by_use
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
    "ABLATION_NOTE",
    "CHANGED_AFTER_SEEN_ROWS",
    "CHANGED_AFTER_SEEN_SPEEDUPS",
    "MET_TOLERANCE",
    "OUT_OF_FIT_ROWS",
    "PAPER_ABLATION",
    "PAPER_SPEEDUP",
    "PAPER_SPEEDUP_NOT_SIMULATED",
    "PRESETS",
    "SPEEDUP",
    "SPEEDUP_NOTE",
    "TRAINING_ROWS",
    "TRAINING_SPEEDUPS",
    "TRAIN_NODE_HOURS_PER_GROUP_2_4T",
    "TRAIN_NODE_HOURS_PER_GROUP_122B",
    "WORKLOADS",
    "AblationRow",
    "BroadcastDone",
    "Calibration",
    "CeilingLogNormal",
    "ClusterConfig",
    "CoreDecider",
    "CostFit",
    "Decider",
    "Departure",
    "EmpiricalWorkload",
    "EventQueue",
    "FigureFit",
    "GroupSample",
    "MeasuredCosts",
    "MicrostepDone",
    "Preset",
    "ProfileFit",
    "PublishDone",
    "ReadyPool",
    "Role",
    "SimCluster",
    "SimResult",
    "SimRun",
    "SpeedupRow",
    "StepTimeUse",
    "TimeUse",
    "Trainer",
    "TransitionRecord",
    "UpdateDone",
    "UseSeconds",
    "WorkloadModel",
    "ablation_loss",
    "ablation_role",
    "ablation_table",
    "calibrate",
    "check_presets",
    "cumulative_speedup",
    "fit_profile",
    "format_account",
    "get_preset",
    "load_workload",
    "measured_cluster",
    "parse_workload",
    "planned_runs",
    "predict_run",
    "profile",
    "profile_draws",
    "profile_loss",
    "role_timeline",
    "seconds_by_use",
    "simulate",
    "speedup_loss",
    "speedup_role",
    "speedup_table",
    "steps_and_speedup",
    "waterlevel",
    "with_costs",
    "with_policy",
    "workload_from_run",
    "workload_stats",
]
