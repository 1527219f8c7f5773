"""The record spool against a store that refuses: a record refused for good is set aside (a
dead letter, a ``record.quarantined`` note once the store answers, an error logged) and the
records behind it are written; transient errors are waited out."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest

from gyre_proxy.ingest import RecordSpool
from gyre_proxy.ingest.spool_files import DeadLetters
from gyre_proxy.service import ProxyConfig, ProxyService
from gyre_store import RecordQuarantined
from gyre_store.trees import TrajectoryRecorder
from tests.unit.proxy.spool_stores import StoreLog, is_bad, started, started_ids

pytestmark = pytest.mark.anyio


def test_the_records_behind_one_the_store_refuses_are_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = StoreLog(refuse=is_bad)
    spool = RecordSpool(TrajectoryRecorder(log), directory=tmp_path / "spool", linger_s=0.2)
    with caplog.at_level(logging.ERROR, logger="gyre_proxy.ingest.spool"):
        for record in (started("a"), started("b", engine="bad"), started("c")):
            spool.submit(record)  # one batch
        assert spool.flush(10)
        spool.submit(started("d"))  # a later one
        assert spool.flush(10)
    spool.close()

    assert started_ids(log) == ["a", "c", "d"]
    assert spool.quarantined == 1 and spool.lost == 0 and spool.written == 3
    [letter] = DeadLetters(tmp_path / "spool" / "dead-letter.jsonl").read()
    assert letter["body"] == {
        "execution_id": "b",
        "run_id": "r",
        "engine": "bad",
        "launcher": "",
        "folder": "",
    }
    assert letter["idempotency_key"] == "s:b" and "22P05" in letter["error"]
    [note] = [r.event for r in log.read(0) if isinstance(r.event, RecordQuarantined)]
    assert note.record_stream == "execution:b" and note.record_key == "s:b" and note.run_id == "r"
    assert note.dead_letter == str(tmp_path / "spool" / "dead-letter.jsonl") and "22P05" in note.error
    [error] = [r for r in caplog.records if "execution:b" in r.getMessage()]
    assert error.levelno == logging.ERROR and "set aside" in error.getMessage()


def test_a_record_refused_while_the_store_is_down_is_noted_once_it_answers(tmp_path: Path) -> None:
    log = StoreLog()
    log.down = True
    spool = RecordSpool(TrajectoryRecorder(log), directory=tmp_path / "spool", max_backoff_s=0.01)
    # An empty id fails the checks made before the database: refused even while it is down.
    spool.submit(started(""))
    deadline = time.monotonic() + 10
    while not spool.quarantined:
        assert time.monotonic() < deadline, "the refused record was not set aside"
        time.sleep(0.01)
    assert len(DeadLetters(tmp_path / "spool" / "dead-letter.jsonl").read()) == 1
    spool.submit(started("c"))
    assert not spool.flush(0.2) and log.read(0) == []  # the note and c wait for the store
    log.down = False
    assert spool.flush(10)
    spool.close()
    assert [r.event_type for r in log.read(0)] == ["record.quarantined", "execution.started"]
    assert started_ids(log) == ["c"] and spool.retries > 0


async def test_the_proxy_reports_what_its_spool_set_aside_on_health(tmp_path: Path) -> None:
    service = ProxyService(StoreLog(), ProxyConfig(engines=[], spool_dir=tmp_path / "spool"))
    service.spool.submit(started(""))  # refused by the checks before the store
    assert service.spool.flush(10)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=service.app), base_url="http://proxy"
    ) as http:
        health = (await http.get("/health")).json()
    service.spool.close()
    assert health["status"] == "ok"
    assert health["spool_quarantined"] == 1 and health["spool_lost"] == 0 and health["spool_pending"] == 0
    assert health["spool_written"] == 0
