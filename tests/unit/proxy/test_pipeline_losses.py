"""Nothing the answer pipeline owes the log or an engine is dropped without a trace.

A ``request.moved`` note survives a store outage (it goes through the record spool), and an
abort an engine refuses is logged and counted, since that engine may keep generating.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from gyre_proxy.answer import AnswerPipeline, Router
from gyre_proxy.engines.testing import FakeEngine
from gyre_proxy.exceptions import EngineUnavailable
from gyre_proxy.harness import GenericHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, RecordSpool
from gyre_store import InMemoryEventLog, RequestMoved, StoreUnavailable
from gyre_store.catalog import MovePath
from gyre_store.log import AppendResult, NewEvent
from gyre_store.trees import TrajectoryRecorder

pytestmark = pytest.mark.anyio


class OutageLog(InMemoryEventLog):
    """An in-memory log whose first ``failures`` appends fail as if the database were down."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def append(self, events: Sequence[NewEvent]) -> list[AppendResult]:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("connection refused")
        return super().append(events)


class AbortFails(FakeEngine):
    """An engine that answers generate but whose abort endpoint is unreachable."""

    async def abort(self, rid: str) -> None:
        raise EngineUnavailable(f"abort {rid}: connection reset")


def pipeline_over(template: Qwen3Template, log: InMemoryEventLog, engine: FakeEngine) -> AnswerPipeline:
    recorder = TrajectoryRecorder(log)
    return AnswerPipeline(
        Ingestor(recorder, template, GenericHarness()),
        Router([("e", engine)]),  # type: ignore[list-item]
        RecordSpool(recorder, max_backoff_s=0.01),
    )


async def test_a_move_is_recorded_even_when_the_store_was_down_at_first(template: Qwen3Template) -> None:
    log = OutageLog(failures=2)
    pipeline = pipeline_over(template, log, FakeEngine())
    source = pipeline.router.engine_for("ex")
    await pipeline._move("ex", "run", source, "req-1")
    assert pipeline.spool.flush(10)
    pipeline.spool.close()
    moved = [ev.event for ev in log.read(0) if isinstance(ev.event, RequestMoved)]
    assert [(m.request_id, m.source, m.path) for m in moved] == [("req-1", "e", MovePath.REPREFILL)]
    assert pipeline.spool.retries == 2 and log.failures == 0


async def test_a_failed_abort_is_logged_and_counted(
    template: Qwen3Template, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = pipeline_over(template, InMemoryEventLog(), AbortFails())
    source = pipeline.router.engine_for("ex")
    with caplog.at_level(logging.WARNING, logger="gyre_proxy.answer.pipeline"):
        await pipeline._move("ex", "run", source, "req-1")  # a re-prefill move aborts on the source
    pipeline.spool.close()
    assert pipeline.abort_failures == 1
    [warning] = [r for r in caplog.records if r.name == "gyre_proxy.answer.pipeline"]
    assert warning.levelno == logging.WARNING and "engine e" in warning.getMessage()
    assert "req-1" in warning.getMessage() and warning.exc_info is not None
