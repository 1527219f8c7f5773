"""Typed errors of the scheduling plane; every message names the constraint that failed.

GyreSchedError
├── ConfigError                  a scheduler or cluster setting is infeasible
│   ├── CapacityBelowBatchError  rollout capacity cannot hold one batch
│   ├── CellCountError           K < 1, or an impossible split of cells
│   ├── RhoMinError              rho_min outside (0, 1]
│   ├── NegativeOverheadError    a duration or overhead is negative
│   └── StalenessError           (phi, mu) or a staleness target cannot be realised
├── WorkloadError                a workload model or file is unusable
│   └── WorkloadFileError        a workload file has a bad row or format
├── CounterDecreaseError         a cumulative counter was asked to go down
├── InputOrderError              an input contradicts the state it arrived in
├── UnknownPresetError           no simulation preset has that name
└── LiveRunError                 the live controller or a replay cannot go on with a run
    ├── ConfigMismatchError      the recorded scheduler config differs from the given one
    ├── ReplayDivergedError      recorded inputs did not reproduce the recorded decisions
    ├── ControllerConflictError  another controller recorded this run's next input first
    ├── StoreMappingError        a store event names something the scheduler did not number
    ├── NoRecordedRunError       no scheduler events are recorded for that run
    └── UnkeyedTransitionStep    a transition step reached the live sink outside a keyed command
"""

from __future__ import annotations


class GyreSchedError(Exception):
    """The root of every error raised by gyre_sched."""


class ConfigError(GyreSchedError):
    """A scheduler or cluster setting is infeasible."""


class CapacityBelowBatchError(ConfigError):
    """The rollout capacity cannot hold the executions of one batch."""


class CellCountError(ConfigError):
    """The number of cells, or the split of cells between roles, is impossible."""


class RhoMinError(ConfigError):
    """rho_min must lie in (0, 1]."""


class NegativeOverheadError(ConfigError):
    """A duration, overhead or timer was negative."""


class StalenessError(ConfigError):
    """The dispatch parameters (phi, mu) or the staleness target cannot be realised."""


class WorkloadError(GyreSchedError):
    """A workload model is unusable."""


class WorkloadFileError(WorkloadError):
    """A workload file has a bad row or an unknown format."""


class CounterDecreaseError(GyreSchedError):
    """The cumulative counters d, p and f never decrease."""


class InputOrderError(GyreSchedError):
    """An input contradicts the scheduler state it arrived in."""


class UnknownPresetError(GyreSchedError):
    """No simulation preset has that name."""


class LiveRunError(GyreSchedError):
    """The live controller or a replay of the log cannot go on with a run."""


class ConfigMismatchError(LiveRunError):
    """The run's recorded scheduler config differs from the one this controller was given."""


class ReplayDivergedError(LiveRunError):
    """Replaying the recorded inputs did not reproduce the recorded decisions."""


class ControllerConflictError(LiveRunError):
    """Another controller recorded this run's next input first: only one may drive a run."""


class StoreMappingError(LiveRunError):
    """A store event names an execution, group or engine the scheduler did not number."""


class NoRecordedRunError(LiveRunError):
    """No scheduler events are recorded for that run: nothing to replay."""


class UnkeyedTransitionStep(LiveRunError):
    """A role-transition step reached the live sink outside a keyed command: its commands
    must carry the controller's input number, or a repeat after a crash would not be known."""
