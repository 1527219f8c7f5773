"""Counters, configuration validation and the staleness arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre_sched import (
    CapacityBelowBatchError,
    CellCountError,
    ConfigError,
    CounterDecreaseError,
    Counters,
    NegativeOverheadError,
    PolicyKind,
    RhoMinError,
    SchedConfig,
    StalenessError,
    dispatch_params,
    mean_staleness,
)
from gyre_sched.sim import ClusterConfig
from tests.unit.sched.helpers import tiny


def test_counter_views() -> None:
    c = Counters().advance(dispatched=10).advance(started=6).advance(finished=2)
    assert (c.queued, c.running, c.waterlevel) == (4, 4, 8)


@pytest.mark.parametrize("step", [{"dispatched": -1}, {"started": -1}, {"finished": -2}])
def test_counters_refuse_to_decrease(step: dict[str, int]) -> None:
    with pytest.raises(CounterDecreaseError, match="never decrease"):
        Counters(5, 3, 1).advance(**step)


def test_counters_refuse_p_past_d_and_f_past_p() -> None:
    with pytest.raises(CounterDecreaseError, match="exceed d"):
        Counters(2, 2, 0).advance(started=1)
    with pytest.raises(CounterDecreaseError, match="exceed p"):
        Counters(2, 1, 1).advance(finished=1)
    with pytest.raises(CounterDecreaseError, match="counter f"):
        Counters(3, 3, 2).check_successor(Counters(3, 3, 1))


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 5)), max_size=40))
def test_counters_stay_ordered_and_monotone(steps: list[tuple[int, int, int]]) -> None:
    c = Counters()
    for dd, dp, df in steps:
        dp = min(dp, c.queued + dd)
        df = min(df, c.running + dp)
        nxt = c.advance(dispatched=dd, started=dp, finished=df)
        c.check_successor(nxt)
        assert nxt.d >= nxt.p >= nxt.f >= 0
        c = nxt


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"cells": 0}, CellCountError, "K >= 1"),
        ({"rho_min": 0.0}, RhoMinError, "(0, 1]"),
        ({"rho_min": 1.5}, RhoMinError, "(0, 1]"),
        ({"tau_s": -1.0}, NegativeOverheadError, "tau"),
        ({"cell_capacity": 1}, CapacityBelowBatchError, "below one batch"),
        ({"phi": 0.3}, StalenessError, "whole number of groups"),
        ({"mu": 0}, StalenessError, "mu=0"),
    ],
)
def test_infeasible_settings_name_their_constraint(
    changes: dict[str, object], error: type[ConfigError], words: str
) -> None:
    with pytest.raises(
        error, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        tiny(**changes)


def test_async_needs_a_pool() -> None:
    with pytest.raises(CapacityBelowBatchError, match="C_s > 0"):
        SchedConfig(policy=PolicyKind.ASYNC, cells=2, cell_capacity=64, pool_capacity=0).validate()


@pytest.mark.parametrize("field", ["to_train_s", "to_rollout_s", "publish_s", "update_s"])
def test_negative_overheads_are_refused(field: str) -> None:
    with pytest.raises(NegativeOverheadError, match=field):
        ClusterConfig(cell_nodes=1, train_node_hours_per_group=1.0, **{field: -0.5}).validate()  # type: ignore[arg-type]


def test_dispatch_params_match_the_paper() -> None:
    assert dispatch_params(PolicyKind.ASYNC, 1.5) == (1.5, 1)
    assert dispatch_params(PolicyKind.COLOCATE, 1.5) == (0.0, 4)
    assert dispatch_params(PolicyKind.ELASTIC, 1.5, mu=3) == (0.5, 3)
    assert dispatch_params(PolicyKind.ELASTIC, 1.0, mu=2) == (0.5, 2)
    with pytest.raises(StalenessError):
        dispatch_params(PolicyKind.COLOCATE, 1.25)
    with pytest.raises(StalenessError):
        dispatch_params(PolicyKind.ELASTIC, 0.5, mu=3)
    assert mean_staleness(0.5, 3) == 1.5


def test_dispatch_sizes() -> None:
    cfg = tiny(phi=0.5, mu=2)
    assert (cfg.initial_groups, cfg.burst_groups, cfg.batch_executions) == (10, 8, 8)
