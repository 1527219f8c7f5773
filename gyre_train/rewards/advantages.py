"""Group-relative advantages from the N rewards of one rollout group (no value function).

Placeholders (total failures) enter the group statistics with reward 0; excluded executions
(no valid reward within the budget) stay outside them and get advantage 0. This module does not
turn evaluation outcomes into rewards, and does not decide when a group is complete.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from gyre_train.exceptions import InvalidConfigError, InvalidRewardsError


class RewardStatus(Enum):
    """How an execution's reward enters its group."""

    VALID = "valid"  # evaluated, including a scored timeout and a valid zero
    PLACEHOLDER = "placeholder"  # total failure: a zero-reward placeholder that counts in the group
    EXCLUDED = "excluded"  # no valid reward: out of the statistics, advantage 0, still counts in B*N


@dataclass(frozen=True, slots=True)
class ExecutionReward:
    """One execution's scalar reward and its status."""

    execution_id: str
    reward: float
    status: RewardStatus = RewardStatus.VALID


@dataclass(frozen=True, slots=True)
class AdvantageConfig:
    """Mean-centring is always on; `scale_by_std` divides by (population std + epsilon)."""

    scale_by_std: bool = True
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        if not (self.epsilon >= 0 and math.isfinite(self.epsilon)):
            raise InvalidConfigError(f"epsilon must be finite and >= 0, got {self.epsilon}")


@dataclass(frozen=True, slots=True)
class GroupAdvantages:
    """Advantages in the order of the rewards given, with the statistics they came from."""

    execution_ids: tuple[str, ...]
    advantages: tuple[float, ...]
    mean: float
    std: float

    def advantage_of(self, execution_id: str) -> float:
        return self.advantages[self.execution_ids.index(execution_id)]


def group_advantages(rewards: Sequence[ExecutionReward], config: AdvantageConfig) -> GroupAdvantages:
    """A_i = r_i - mean (optionally / (std + eps)) over the group's valid and placeholder rewards.

    All-equal rewards give exactly 0 (no NaN, whatever the scaling). Raises InvalidRewardsError on
    an empty group, a repeated execution id, a non-finite reward or a placeholder with a non-zero
    reward.
    """
    if not rewards:
        raise InvalidRewardsError("a group needs at least one execution")
    ids = tuple(r.execution_id for r in rewards)
    if len(set(ids)) != len(ids):
        raise InvalidRewardsError(f"execution ids repeat within the group: {ids}")
    for r in rewards:
        if r.status is not RewardStatus.EXCLUDED and not math.isfinite(r.reward):
            raise InvalidRewardsError(f"execution {r.execution_id} has reward {r.reward}")
        if r.status is RewardStatus.PLACEHOLDER and r.reward != 0.0:
            raise InvalidRewardsError(f"placeholder {r.execution_id} must have reward 0, got {r.reward}")
    counted = [i for i, r in enumerate(rewards) if r.status is not RewardStatus.EXCLUDED]
    values = np.array([rewards[i].reward for i in counted], dtype=np.float64)  # [n_counted]
    advantages = np.zeros(len(rewards), dtype=np.float64)  # [N]
    if values.size == 0:
        return GroupAdvantages(ids, tuple(advantages.tolist()), 0.0, 0.0)
    mean = float(values.mean())
    std = float(values.std())
    # Equal rewards carry no signal; the explicit test avoids (r - mean) / (std + eps) turning a
    # rounding residue of the mean into a spurious advantage.
    if values.max() != values.min():
        centred = values - mean
        advantages[counted] = centred / (std + config.epsilon) if config.scale_by_std else centred
    return GroupAdvantages(ids, tuple(advantages.tolist()), mean, std)
