"""What a publication leaves in the log and the run's report: policy.published (v2) carries the
method, seconds, engines reached and skipped and requests paused; a v1 event still reads (with
the defaults); the core records the publisher's figures; the report lists each publication with
the model calls retried while it ran."""

from __future__ import annotations

import msgspec
import pytest

from gyre_store import InMemoryEventLog, ModelCallRecorded, NewEvent, StreamId, WeightsPublished, new_record
from gyre_store.log import REGISTRY
from gyre_tools.run_outputs import publications_from_log
from gyre_train.cells import BurstPlan, SyntheticBatchConfig, synthetic_batch
from tests.examples import _arrays
from tests.unit.train import cell_fakes

MEASURED = WeightsPublished(
    run_id="r",
    policy_version=1,
    step=0,
    method="tensor",
    started_at=1000.0,
    save_s=1.0,
    send_s=2.0,
    engines={"r:pool-0": 1.5, "r:pool-1": 1.75},
    skipped=("r:pool-2",),
    paused={"r:pool-0": 2, "r:pool-1": 0},
)


def test_a_v1_event_reads_with_the_defaults() -> None:
    v1 = b'{"run_id": "r", "policy_version": 3, "step": 2}'
    event = REGISTRY.from_body("policy.published", 1, v1)
    assert event == WeightsPublished(run_id="r", policy_version=3, step=2)
    assert (event.method, event.engines, event.skipped, event.paused, event.started_at) == (
        "",
        {},
        (),
        {},
        0.0,
    )


def test_the_figures_go_through_the_log() -> None:
    log = InMemoryEventLog()
    log.append([NewEvent(MEASURED)])
    [recorded] = log.read_stream(StreamId("policy", "r"))
    assert recorded.event == MEASURED
    assert WeightsPublished.schema_version == 2


def test_negative_seconds_are_refused() -> None:
    body = msgspec.json.encode({"run_id": "r", "policy_version": 1, "step": 0, "send_s": -1.0})
    with pytest.raises(Exception, match="send_s"):
        REGISTRY.from_body("policy.published", 2, body)


def _call(
    request: str, start: float, duration: float, *, retry_of: str | None, run_id: str = "r"
) -> NewEvent:
    event = ModelCallRecorded(
        execution_id="e",
        run_id=run_id,
        request_id=request,
        retry_of=retry_of,
        started_at=start,
        duration_s=duration,
    )
    return new_record(event, _arrays())


def test_the_report_lists_each_publication_with_the_calls_retried_while_it_ran() -> None:
    log = InMemoryEventLog()
    log.append(
        [
            NewEvent(MEASURED),  # ran 1000 -> 1003
            NewEvent(WeightsPublished(run_id="r", policy_version=2, step=1)),  # v1: no figures
            _call("a2", 1002.0, 3.0, retry_of="a1"),  # a retry overlapping the publication
            _call("b2", 995.0, 5.5, retry_of="b1"),  # began before, still running at 1000.5
            _call("c2", 1010.0, 1.0, retry_of="c1"),  # after it
            _call("d1", 1001.0, 1.0, retry_of=None),  # no retry
            _call("o2", 1001.0, 1.0, retry_of="o1", run_id="other"),  # another run's
        ]
    )
    first, second = publications_from_log(log, "r")
    assert first == {
        "version": 1,
        "step": 0,
        "method": "tensor",
        "save_s": 1.0,
        "send_s": 2.0,
        "engines": {"r:pool-0": 1.5, "r:pool-1": 1.75},
        "skipped": ["r:pool-2"],
        "paused": {"r:pool-0": 2, "r:pool-1": 0},
        "retried": 2,
        "note": "",
    }
    assert (second["version"], second["method"], second["retried"], second["paused"]) == (2, "", None, {})


class Measured(cell_fakes.NoEngines):
    """A publisher that measured its publications (as LivePublisher does)."""

    def publication_event(self, policy_version: int, step: int) -> WeightsPublished:
        return msgspec.structs.replace(MEASURED, policy_version=policy_version, step=step)


def test_the_core_records_what_the_publisher_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cell_fakes, "NoEngines", Measured)
    data = SyntheticBatchConfig(groups=2, executions=2, max_rows=2)
    batches = [synthetic_batch(0, b, data) for b in range(2)]
    run = cell_fakes.train_in_threads(batches, [BurstPlan(batches=(0,)), BurstPlan(batches=(1,))], cells=1)
    published = run.events(WeightsPublished)
    assert [(e.policy_version, e.step) for e in published] == [(1, 0), (2, 1)]
    assert all(e.method == "tensor" and e.paused == MEASURED.paused and e.send_s == 2.0 for e in published)
