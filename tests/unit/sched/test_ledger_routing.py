"""The paper's equations and the destination order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gyre_sched import (
    POOL,
    assign,
    core_may_stay,
    destination_order,
    may_join,
    rollout_capacity,
    startable,
    supply,
)


def test_equation_1() -> None:
    assert rollout_capacity(pool_capacity=100, cells=8, training_cells=3, cell_capacity=144) == 100 + 5 * 144


def test_equation_2_boundary() -> None:
    assert may_join(waterlevel=576, capacity=720, cell_capacity=144)
    assert not may_join(waterlevel=577, capacity=720, cell_capacity=144)


def test_equation_3_boundary() -> None:
    assert core_may_stay(waterlevel=192, incoming=1536, pool_capacity=0, cells=13, cell_capacity=144)
    assert not core_may_stay(waterlevel=193, incoming=1536, pool_capacity=0, cells=13, cell_capacity=144)


def test_start_rule_and_supply() -> None:
    assert startable(queued=10, capacity=20, running=15) == 5
    assert startable(queued=3, capacity=20, running=15) == 3
    assert startable(queued=3, capacity=20, running=25) == 0
    assert supply(ready_unclaimed=30, batch_needs=5) == 5


def test_destinations_prefer_pool_then_highest_cell() -> None:
    assert destination_order(10, [1, 3, 2]) == [POOL, 3, 2, 1]
    assert destination_order(0, [1, 3, 2]) == [3, 2, 1]


@given(
    st.lists(st.integers(0, 1000), unique=True, max_size=50),
    st.dictionaries(st.sampled_from([POOL, 0, 1, 2, 3]), st.integers(0, 12)),
)
def test_assign_never_overfills(executions: list[int], free: dict[int, int]) -> None:
    order = [POOL, 3, 2, 1, 0]
    placements = assign(executions, order, free)
    assert len(placements) == min(len(executions), sum(free.values()))
    for engine in order:
        assert sum(p.engine == engine for p in placements) <= free.get(engine, 0)
    assert [p.execution for p in placements] == executions[: len(placements)]
