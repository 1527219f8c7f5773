"""The record spool's journal on disk: what a process leaves there is sent by the next one on
the folder (once: each record's key), the files are emptied as records are written, a frame cut
short by a kill is kept aside, and a folder belongs to one process and one store."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gyre_proxy.exceptions import SpoolInUse
from gyre_proxy.ingest import RecordSpool
from gyre_proxy.ingest.spool_files import AnswerLog, SpoolJournal, encode_frame
from gyre_store import REGISTRY
from gyre_store.trees import TrajectoryRecorder
from tests.unit.proxy.spool_stores import StoreLog, call, started, started_ids


def segments(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.glob("segment-*.spool"))}


def test_records_a_stopped_process_could_not_write_are_sent_by_the_next(tmp_path: Path) -> None:
    log = StoreLog()
    log.down = True
    first = RecordSpool(TrajectoryRecorder(log), directory=tmp_path, max_backoff_s=0.01)
    for ex in ("a", "b", "c"):
        first.submit(started(ex))
    first.close(timeout=0.2)  # the store is still down: they stay on disk
    assert first.lost == 0 and sum(segments(tmp_path).values()) > 0

    log.down = False
    second = RecordSpool(TrajectoryRecorder(log), directory=tmp_path)
    assert second.replayed == 3
    assert second.flush(10)
    second.close()
    assert started_ids(log) == ["a", "b", "c"]
    third = RecordSpool(TrajectoryRecorder(log), directory=tmp_path)
    assert third.replayed == 0  # written: nothing is left to send again
    third.close()


def test_a_record_written_before_a_crash_but_still_in_the_journal_is_not_stored_twice(
    tmp_path: Path,
) -> None:
    log = StoreLog()
    journal = SpoolJournal(tmp_path, REGISTRY)
    for ex in ("a", "b"):
        journal.append(started(ex))
    log.append([started("a")])  # "a" reached the store; the process died before emptying the file
    journal.close()
    spool = RecordSpool(TrajectoryRecorder(log), directory=tmp_path)
    assert spool.flush(10)
    spool.close()
    assert started_ids(log) == ["a", "b"]


def test_written_segments_are_deleted_and_the_journal_holds_only_what_waits(tmp_path: Path) -> None:
    log = StoreLog()
    log.down = True
    spool = RecordSpool(TrajectoryRecorder(log), directory=tmp_path, segment_bytes=300, max_backoff_s=0.01)
    for i in range(20):
        spool.submit(started(f"x{i}"))
    assert len(segments(tmp_path)) > 3  # the journal rotated while the store was down
    log.down = False
    assert spool.flush(10)
    assert len(segments(tmp_path)) == 1  # the older segments are deleted once written
    spool.submit(started("y"))
    assert spool.flush(10)
    log.down = True
    spool.submit(started("z"))  # waits
    spool.close(timeout=0.2)
    assert len(segments(tmp_path)) <= 2
    assert started_ids(log) == [*(f"x{i}" for i in range(20)), "y"]
    log.down = False
    after = RecordSpool(TrajectoryRecorder(log), directory=tmp_path)
    assert after.replayed == 1  # z alone: what was written is behind the marks or deleted
    assert after.flush(10)
    after.close()
    assert started_ids(log)[-1] == "z"


def test_a_frame_cut_short_by_a_kill_is_kept_aside_and_the_rest_is_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = SpoolJournal(tmp_path, REGISTRY)
    journal.append(started("a"))
    journal.close()
    [segment] = tmp_path.glob("segment-*.spool")
    cut = encode_frame(started("b"))[:20]
    with segment.open("ab") as f:
        f.write(cut)
    log = StoreLog()
    with caplog.at_level(logging.WARNING, logger="gyre_proxy.ingest.spool"):
        spool = RecordSpool(TrajectoryRecorder(log), directory=tmp_path)
    assert spool.flush(10)
    spool.close()
    assert started_ids(log) == ["a"]
    [kept] = tmp_path.glob("segment-*.unreadable-*")
    assert kept.read_bytes() == cut
    assert any("cut short" in r.getMessage() and str(kept) in r.getMessage() for r in caplog.records)


def test_a_folder_is_held_by_one_process_at_a_time(tmp_path: Path) -> None:
    log = StoreLog()
    first = RecordSpool(TrajectoryRecorder(log), directory=tmp_path)
    with pytest.raises(SpoolInUse, match="held by process"):
        RecordSpool(TrajectoryRecorder(log), directory=tmp_path, lock_wait_s=0.2)
    first.close()
    RecordSpool(TrajectoryRecorder(log), directory=tmp_path).close()  # released on close


def test_records_left_for_another_store_are_moved_aside_not_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = SpoolJournal(tmp_path, REGISTRY, store="db-a:5432/one")
    journal.append(started("a"))
    journal.close()
    log = StoreLog()
    with caplog.at_level(logging.ERROR, logger="gyre_proxy.ingest.spool"):
        spool = RecordSpool(TrajectoryRecorder(log), directory=tmp_path, store="db-b:5432/two")
    assert spool.replayed == 0
    spool.close()
    assert started_ids(log) == []
    [aside] = tmp_path.glob("store-*")
    assert (aside / "store").read_text() == "db-a:5432/one" and list(aside.glob("segment-*.spool"))
    assert any("another store" in r.getMessage() for r in caplog.records)


def test_the_answers_log_has_a_line_per_model_call_record_submitted(tmp_path: Path) -> None:
    log = StoreLog()
    answers = tmp_path / "answers.jsonl"
    spool = RecordSpool(TrajectoryRecorder(log), directory=tmp_path / "spool", answers_log=answers)
    for rid in ("r1", "r2"):
        spool.submit(call("x", rid))
    spool.submit(started("not-a-call"))
    assert spool.flush(10)
    spool.close()
    lines = AnswerLog.read(answers)
    assert [(a["execution_id"], a["request_id"], a["finish"]) for a in lines] == [
        ("x", "r1", "stop"),
        ("x", "r2", "stop"),
    ]
