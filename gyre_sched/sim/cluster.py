"""The simulated cluster's physical settings: cell size, training speed, overheads.

Separate from ``SchedConfig`` because the decision core never sees these: it learns
about time only through the inputs the simulated (or real) cluster sends it.
"""

from __future__ import annotations

import msgspec

from gyre_sched.exceptions import CellCountError, NegativeOverheadError

TO_TRAIN_S = 8.52  # paper: mean rollout -> training transition
TO_ROLLOUT_S = 3.46  # paper: mean training -> rollout transition


class ClusterConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Time costs of the simulated cluster; training speed scales with nodes per cell."""

    cell_nodes: int  # nodes in one cell; a cell trains at cell_nodes / train_node_hours_per_group
    train_node_hours_per_group: float  # calibrated: node-hours of training work per group
    streaming: bool = True  # streaming training with dynamic membership
    microsteps_per_group: int = 4
    to_train_s: float = TO_TRAIN_S
    to_rollout_s: float = TO_ROLLOUT_S
    update_s: float = 120.0  # gradient reduction, clipping and the optimizer update
    broadcast_s: float = 30.0  # parameters to satellites after a non-final update
    publish_s: float = 300.0  # weights to every rollout engine at a burst end
    pipeline_s: float = 60.0  # one pipeline warmup and drain per cell per batch

    def validate(self) -> ClusterConfig:
        """Return self if feasible, else raise the ConfigError naming the constraint."""
        if self.cell_nodes < 1:
            raise CellCountError(f"cell_nodes={self.cell_nodes}: a cell needs at least one node")
        if self.microsteps_per_group < 1:
            raise CellCountError(f"microsteps_per_group={self.microsteps_per_group} must be >= 1")
        if self.train_node_hours_per_group <= 0:
            raise NegativeOverheadError(
                f"train_node_hours_per_group={self.train_node_hours_per_group} must be > 0"
            )
        for name in ("to_train_s", "to_rollout_s", "update_s", "broadcast_s", "publish_s", "pipeline_s"):
            value = getattr(self, name)
            if value < 0:
                raise NegativeOverheadError(f"{name}={value} must be >= 0")
        return self

    def microstep_s(self) -> float:
        """Seconds one cell spends on one micro-step."""
        return self.train_node_hours_per_group * 3600.0 / self.microsteps_per_group / self.cell_nodes
