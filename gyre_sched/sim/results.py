"""What one simulated run produced: step times, staleness, transitions, the waterlevel.

Plain frozen structs so a result is JSON as it stands (``SimResult.to_json``); the
decision log itself is kept separately since it can be large.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gyre_sched.decision import Direction
from gyre_sched.sim.time_use import StepTimeUse


class TransitionRecord(msgspec.Struct, frozen=True):
    """One role change with the ledger values in force when it began."""

    at_s: float
    done_s: float | None
    cell: int
    direction: Direction
    w: int
    c_r: int
    c_e: int


class WaterlevelSample(msgspec.Struct, frozen=True, array_like=True):
    """(t, w, C_R - C_e, k) after an input."""

    at_s: float
    w: int
    headroom: int
    training_cells: int


class SimResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of ``simulate``."""

    name: str
    policy: str
    phi: float
    mu: int
    cells: int
    steps: int
    seed: int
    workload: str
    step_end_s: tuple[float, ...]
    step_durations_h: tuple[float, ...]
    total_h: float
    mean_staleness: float
    expected_staleness: float
    staleness: tuple[int, ...]
    transitions: tuple[TransitionRecord, ...]
    waterlevel: tuple[WaterlevelSample, ...]
    reroutes: int
    executions_finished: int
    inputs_processed: int
    time_use: tuple[StepTimeUse, ...] = ()  # where each step's time went (``time_use``)

    def to_json(self) -> bytes:
        """The result as JSON bytes."""
        return msgspec.json.encode(self)

    def summary(self) -> dict[str, Any]:
        """The headline figures, for tables."""
        return {
            "name": self.name,
            "policy": self.policy,
            "phi": self.phi,
            "mu": self.mu,
            "total_h": self.total_h,
            "mean_staleness": self.mean_staleness,
            "transitions": len(self.transitions),
        }


def cumulative_speedup(baseline: SimResult, candidate: SimResult) -> list[float]:
    """Per step: baseline's cumulative time over the candidate's (> 1 means faster)."""
    steps = min(len(baseline.step_end_s), len(candidate.step_end_s))
    return [baseline.step_end_s[i] / candidate.step_end_s[i] for i in range(steps)]
