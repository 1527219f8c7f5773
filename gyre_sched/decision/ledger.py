"""The paper's equations as pure functions of plain numbers.

eq. 1  C_R(t) = C_s + (K - k(t)) C_e                 available rollout capacity
eq. 2  w(t) <= C_R(t) - C_e                          the next cell may join training
eq. 3  w + mu N B <= C_s + (K - 1) C_e               the core may stay at a burst end
plus the start rule min(d - p, C_R - (p - f)) and the supply check min(ready, need) >= rho_min B.
"""

from __future__ import annotations

import math


def rollout_capacity(pool_capacity: int, cells: int, training_cells: int, cell_capacity: int) -> int:
    """eq. 1: C_R = C_s + (K - k) C_e."""
    return pool_capacity + (cells - training_cells) * cell_capacity


def startable(queued: int, capacity: int, running: int) -> int:
    """How many queued executions to start now: min(d - p, C_R - (p - f)), never negative."""
    return max(0, min(queued, capacity - running))


def may_join(waterlevel: int, capacity: int, cell_capacity: int) -> bool:
    """eq. 2: another cell may leave rollout only while w <= C_R - C_e."""
    return waterlevel <= capacity - cell_capacity


def core_may_stay(waterlevel: int, incoming: int, pool_capacity: int, cells: int, cell_capacity: int) -> bool:
    """eq. 3: w + mu N B <= C_s + (K - 1) C_e."""
    return waterlevel + incoming <= pool_capacity + (cells - 1) * cell_capacity


def supply(ready_unclaimed: int, batch_needs: int) -> int:
    """Ready, unclaimed groups capped by what the current batch still needs."""
    return max(0, min(ready_unclaimed, batch_needs))


def supply_threshold(rho_min: float, batch_groups: int) -> int:
    """rho_min B rounded up to whole groups (the check compares group counts)."""
    return max(1, math.ceil(rho_min * batch_groups - 1e-9))
