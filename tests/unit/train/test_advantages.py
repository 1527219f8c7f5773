from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_train import (
    AdvantageConfig,
    ExecutionReward,
    InvalidConfigError,
    InvalidRewardsError,
    RewardStatus,
    group_advantages,
)

REWARDS = st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=16)


def _valid(rewards: list[float]) -> list[ExecutionReward]:
    return [ExecutionReward(f"e{i}", r) for i, r in enumerate(rewards)]


@settings(max_examples=100)
@given(rewards=REWARDS, scale=st.booleans())
def test_advantages_are_centred_and_optionally_scaled(rewards: list[float], scale: bool) -> None:
    config = AdvantageConfig(scale_by_std=scale)
    result = group_advantages(_valid(rewards), config)
    values = np.array(rewards)
    expected = values - values.mean()
    if scale:
        expected = expected / (values.std() + config.epsilon)
    if values.max() == values.min():
        expected = np.zeros_like(values)
    assert np.allclose(result.advantages, expected, atol=1e-9)
    assert all(math.isfinite(a) for a in result.advantages)
    assert abs(sum(result.advantages)) < 1e-6 * max(1.0, float(np.abs(expected).sum()))


@pytest.mark.parametrize("scale", [True, False])
def test_all_equal_rewards_give_exact_zeros(scale: bool) -> None:
    result = group_advantages(_valid([0.1, 0.1, 0.1]), AdvantageConfig(scale_by_std=scale))
    assert result.advantages == (0.0, 0.0, 0.0)


def test_placeholders_count_and_excluded_do_not() -> None:
    rewards = [
        ExecutionReward("a", 1.0),
        ExecutionReward("b", 0.0, RewardStatus.PLACEHOLDER),
        ExecutionReward("c", float("nan"), RewardStatus.EXCLUDED),
        ExecutionReward("d", 0.5),
    ]
    result = group_advantages(rewards, AdvantageConfig(scale_by_std=False))
    assert result.mean == pytest.approx(0.5)
    assert result.advantages == pytest.approx((0.5, -0.5, 0.0, 0.0))
    assert result.advantage_of("b") == pytest.approx(-0.5)


def test_a_group_of_only_excluded_executions_has_zero_advantages() -> None:
    rewards = [ExecutionReward(f"e{i}", 0.0, RewardStatus.EXCLUDED) for i in range(3)]
    assert group_advantages(rewards, AdvantageConfig()).advantages == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "rewards",
    [
        [],
        [ExecutionReward("a", 1.0), ExecutionReward("a", 0.0)],
        [ExecutionReward("a", float("inf"))],
        [ExecutionReward("a", 1.0, RewardStatus.PLACEHOLDER)],
    ],
)
def test_bad_groups_are_refused(rewards: list[ExecutionReward]) -> None:
    with pytest.raises(InvalidRewardsError):
        group_advantages(rewards, AdvantageConfig())


def test_bad_epsilon_is_refused() -> None:
    with pytest.raises(InvalidConfigError):
        AdvantageConfig(epsilon=-1.0)
