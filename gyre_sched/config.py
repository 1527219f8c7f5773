"""The scheduler's one config object and the staleness arithmetic of boundary dispatch.

Target depth Q_b = (phi + mu) B groups and mean staleness E[d] = phi + (mu - 1)/2.
Async uses (E[d], 1), Colocate (0, 2 E[d] + 1); QwenGyre takes phi and mu directly.
This module validates settings; it knows nothing of time or of the simulator.
"""

from __future__ import annotations

import enum

import msgspec

from gyre_sched.exceptions import (
    CapacityBelowBatchError,
    CellCountError,
    NegativeOverheadError,
    RhoMinError,
    StalenessError,
)

_EPS = 1e-9


class PolicyKind(enum.Enum):
    """Which role-allocation policy drives the cells."""

    ELASTIC = "elastic"
    COLOCATE = "colocate"
    ASYNC = "async"


def mean_staleness(phi: float, mu: int) -> float:
    """Steady-state mean group staleness under boundary dispatch: phi + (mu - 1)/2."""
    return phi + (mu - 1) / 2


def dispatch_params(policy: PolicyKind, target: float, mu: int | None = None) -> tuple[float, int]:
    """(phi, mu) that realise mean staleness ``target`` for ``policy``.

    Async takes (target, 1) and Colocate (0, 2 target + 1). Elastic needs ``mu`` and takes
    phi = target - (mu - 1)/2. Raises StalenessError when no valid pair exists.
    """
    if target < 0:
        raise StalenessError(f"staleness target {target} must be >= 0")
    if policy is PolicyKind.ASYNC:
        return target, 1
    if policy is PolicyKind.COLOCATE:
        raw_mu = 2 * target + 1
        if abs(raw_mu - round(raw_mu)) > _EPS:
            raise StalenessError(f"Colocate needs 2 E[d] + 1 to be a whole number of steps; E[d]={target}")
        return 0.0, round(raw_mu)
    if mu is None:
        raise StalenessError("the elastic policy needs mu together with a staleness target")
    phi = target - (mu - 1) / 2
    if phi < -_EPS:
        raise StalenessError(f"E[d]={target} is below (mu - 1)/2 = {(mu - 1) / 2}: phi would be negative")
    return max(phi, 0.0), mu


class SchedConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the decision core needs: the capacity ledger, the batch shape and dispatch."""

    policy: PolicyKind = PolicyKind.ELASTIC
    cells: int  # K elastic cells, core first
    cell_capacity: int  # C_e concurrent executions of one cell in rollout mode
    pool_capacity: int = 0  # C_s of the separate rollout pool (0 when none)
    group_size: int = 16  # N executions per rollout group
    batch_groups: int = 32  # B groups per training step
    phi: float = 0.5  # extra dispatch in units of B
    mu: int = 3  # training steps per burst
    rho_min: float = 0.25  # supply check threshold, as a fraction of B
    tau_s: float = 60.0  # the supply check must hold this long before a transition

    def validate(self) -> SchedConfig:
        """Return self if feasible, else raise the ConfigError naming the failed constraint."""
        if self.cells < 1:
            raise CellCountError(f"K={self.cells}: the cluster needs at least one cell (K >= 1)")
        if self.cell_capacity < 0 or self.pool_capacity < 0:
            raise CapacityBelowBatchError(
                f"capacities must be >= 0 (C_e={self.cell_capacity}, C_s={self.pool_capacity})"
            )
        if self.group_size < 1 or self.batch_groups < 1:
            raise CapacityBelowBatchError(f"N={self.group_size} and B={self.batch_groups} must both be >= 1")
        if not 0.0 < self.rho_min <= 1.0:
            raise RhoMinError(f"rho_min={self.rho_min} must lie in (0, 1]")
        if self.tau_s < 0:
            raise NegativeOverheadError(f"tau={self.tau_s} s must be >= 0")
        if self.mu < 1:
            raise StalenessError(f"mu={self.mu} must be >= 1 (steps per burst)")
        if self.phi < 0:
            raise StalenessError(f"phi={self.phi} must be >= 0")
        if abs(self.phi * self.batch_groups - round(self.phi * self.batch_groups)) > _EPS:
            raise StalenessError(
                f"phi * B = {self.phi} * {self.batch_groups} must be a whole number of groups"
            )
        if self.policy is PolicyKind.ASYNC and self.pool_capacity == 0:
            raise CapacityBelowBatchError(
                "Async keeps every cell in training: it needs a rollout pool C_s > 0"
            )
        batch = self.group_size * self.batch_groups
        if self.max_rollout_capacity < batch:
            raise CapacityBelowBatchError(
                f"rollout capacity {self.max_rollout_capacity} is below one batch N*B = {batch}"
            )
        return self

    @property
    def batch_executions(self) -> int:
        """N B: executions in one training step."""
        return self.group_size * self.batch_groups

    @property
    def extra_groups(self) -> int:
        """phi B, the groups dispatched beyond the burst itself."""
        return round(self.phi * self.batch_groups)

    @property
    def initial_groups(self) -> int:
        """(phi + mu) B: the target depth Q_b filled at the start."""
        return self.extra_groups + self.mu * self.batch_groups

    @property
    def burst_groups(self) -> int:
        """mu B: the groups one burst consumes and one publication replenishes."""
        return self.mu * self.batch_groups

    @property
    def expected_staleness(self) -> float:
        """phi + (mu - 1)/2 computed with the whole-group phi actually dispatched."""
        return mean_staleness(self.extra_groups / self.batch_groups, self.mu)

    @property
    def max_rollout_capacity(self) -> int:
        """The most rollout capacity this policy can ever offer."""
        if self.policy is PolicyKind.ASYNC:
            return self.pool_capacity
        return self.pool_capacity + self.cells * self.cell_capacity
