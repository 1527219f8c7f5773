"""A trainer cell's Prometheus metrics count the events the cell records, and are served over
HTTP in Prometheus's text format."""

from __future__ import annotations

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gyre_store import (
    CellJoinedBatch,
    InMemoryEventLog,
    MicroStepClaimed,
    MicroStepComputed,
    TrainingUpdate,
    WeightsPublished,
)
from gyre_train.cells import CellMetrics


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _events() -> list[object]:
    return [
        MicroStepClaimed(run_id="r", batch=0, micro_step=0, phase=1, cell=2, deliveries=1),
        MicroStepComputed(run_id="r", batch=0, micro_step=0, phase=1, cell=2, seconds=0.2, tokens=300),
        MicroStepClaimed(run_id="r", batch=0, micro_step=0, phase=2, cell=2, deliveries=1),
        MicroStepComputed(run_id="r", batch=0, micro_step=0, phase=2, cell=2, seconds=0.7, tokens=300),
        MicroStepClaimed(run_id="r", batch=0, micro_step=1, phase=2, cell=2, deliveries=2),
        MicroStepComputed(run_id="r", batch=0, micro_step=1, phase=2, cell=2, seconds=1.5, tokens=120),
        CellJoinedBatch(run_id="r", batch=0, cell=2, policy_version=4, claims_before=0, transport="torch"),
        TrainingUpdate(
            run_id="r",
            batch=0,
            policy_version=5,
            cells=[0, 2],
            dropped=[],
            micro_steps=2,
            loss=0.25,
            grad_norm=1.5,
            final=True,
            failed_reductions=0,
        ),
        WeightsPublished(run_id="r", policy_version=5, step=0, method="disk", save_s=0.4, send_s=1.2),
        WeightsPublished(run_id="r", policy_version=6, step=1),  # v1: no figures
    ]


def test_the_metrics_count_what_the_cell_records_and_are_served_over_http() -> None:
    with CellMetrics(2) as metrics:
        for event in _events():
            metrics.observe(event)  # type: ignore[arg-type]
        metrics.serve(port=0)
        got = _samples(httpx.get(metrics.url, timeout=10).text)
    cell = ("cell", "2")
    assert got[("gyre_trainer_claims_total", (cell, ("pass", "ratios")))] == 1
    assert got[("gyre_trainer_claims_total", (cell, ("pass", "gradient")))] == 2
    assert got[("gyre_trainer_micro_step_seconds_count", (cell, ("pass", "gradient")))] == 2
    assert got[("gyre_trainer_micro_step_seconds_sum", (cell, ("pass", "gradient")))] == 2.2
    assert got[("gyre_trainer_micro_step_seconds_sum", (cell, ("pass", "ratios")))] == 0.2
    # 0.7 s is at most 1 s, 1.5 s is not.
    assert got[("gyre_trainer_micro_step_seconds_bucket", (cell, ("le", "1.0"), ("pass", "gradient")))] == 1
    assert got[("gyre_trainer_tokens_total", (cell, ("pass", "gradient")))] == 420
    assert got[("gyre_trainer_joins_total", (cell,))] == 1
    assert got[("gyre_trainer_updates_total", (cell,))] == 1
    assert (got[("gyre_trainer_loss", (cell,))], got[("gyre_trainer_grad_norm", (cell,))]) == (0.25, 1.5)
    assert got[("gyre_trainer_policy_version", (cell,))] == 5
    assert got[("gyre_trainer_publications_total", (cell,))] == 2
    assert got[("gyre_trainer_publish_seconds_count", (cell, ("part", "send")))] == 1  # v1 has no figures
    assert got[("gyre_trainer_publish_seconds_sum", (cell, ("part", "send")))] == 1.2


def test_a_cell_counts_each_event_it_records_with_or_without_a_database() -> None:
    from gyre_train.cells.cell import _Recorder

    for log in (InMemoryEventLog(), None):
        metrics = CellMetrics(0)
        record = _Recorder(log, "r", metrics)
        events = _events()
        record(*events[:4])  # type: ignore[arg-type]
        got = _samples(generate_latest(metrics.registry).decode())
        assert got[("gyre_trainer_claims_total", (("cell", "0"), ("pass", "gradient")))] == 1
        assert got[("gyre_trainer_micro_step_seconds_count", (("cell", "0"), ("pass", "ratios")))] == 1
        if log is not None:
            assert len(list(log.read(0))) == 4
