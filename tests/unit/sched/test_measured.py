"""The simulator's cluster from a live run's measured costs, on a log whose every second is known."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gyre_sched import WorkloadError, measured_cluster
from gyre_store import (
    GroupConsumed,
    InMemoryEventLog,
    MicroStepComputed,
    NewEvent,
    TrainingUpdate,
    WeightsPublished,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _log() -> InMemoryEventLog:
    now = [T0]
    log = InMemoryEventLog(clock=lambda: now[0])

    def at(seconds: float, *events: object) -> None:
        now[0] = T0 + timedelta(seconds=seconds)
        log.append([NewEvent(e) for e in events])  # type: ignore[arg-type]

    for batch, start in ((0, 10.0), (1, 30.0)):
        # two groups per batch, four micro-steps of 1.5 s (pass 1 and 2 on two cells)
        at(start, *(GroupConsumed(group_id=f"g{batch}{i}", run_id="r", step=batch) for i in range(2)))
        at(start + 3, *(MicroStepComputed(run_id="r", batch=batch, micro_step=m, phase=2, cell=m % 2,
                                          seconds=1.5, tokens=100) for m in range(4)))  # fmt: skip
        update = TrainingUpdate(run_id="r", batch=batch, policy_version=batch + 1, cells=[0, 1],
                                micro_steps=4, loss=0.0, grad_norm=1.0, final=True)  # fmt: skip
        # update and publication: 0.5 s, then 1.0 s (the core records them together)
        at(
            start + 3 + 0.5 * (batch + 1),
            update,
            WeightsPublished(run_id="r", policy_version=batch + 1, step=batch),
        )
    at(50, GroupConsumed(group_id="other", run_id="other", step=0))
    return log


def test_the_cluster_costs_are_the_runs_measured_seconds() -> None:
    costs = measured_cluster(_log(), "r")
    assert (costs.steps, costs.groups, costs.micro_steps) == (2, 4, 8)
    assert costs.compute_s == pytest.approx(12.0)
    c = costs.cluster
    assert c.train_node_hours_per_group * 3600 == pytest.approx(3.0)  # 12 s over 4 groups
    assert c.microsteps_per_group == 2
    assert c.update_s == pytest.approx(0.75)  # mean of 0.5 and 1.0
    assert c.publish_s == 0.0 and c.broadcast_s == 0.0  # inside the update time
    assert c.microstep_s() == pytest.approx(1.5)


def test_a_run_that_never_trained_cannot_be_measured() -> None:
    with pytest.raises(WorkloadError, match="no update"):
        measured_cluster(InMemoryEventLog(), "r")
