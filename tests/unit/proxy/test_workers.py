"""The workers' shared counters: a worker's caches of an execution count as stale once another
worker staged a record of it, and only after that record is written may it reload them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gyre_proxy import ServerStartError, WorkerSync, WorkerTable

pytestmark = pytest.mark.anyio


def tables(path: Path, workers: int = 2) -> list[WorkerTable]:
    WorkerTable.create(path, workers=workers, slots=1024)
    return [WorkerTable(path, workers=workers, index=i, slots=1024) for i in range(workers)]


async def test_another_workers_record_makes_the_cache_stale_once_written(tmp_path: Path) -> None:
    t0, t1 = tables(tmp_path / "t")
    s0, s1 = WorkerSync(t0, wait_s=5), WorkerSync(t1, wait_s=5)
    assert not await s0.fresh("ex")  # never served here: nothing cached to trust
    s0.staged("ex")
    s0.written("ex")
    assert await s0.fresh("ex")  # its own records do not make its cache stale
    assert not await s1.fresh("ex")
    s1.staged("ex")  # worker 1 answered; its spool has not written the record yet

    waiting = asyncio.ensure_future(s0.fresh("ex"))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the reload must see worker 1's record: wait for it
    s1.written("ex")
    assert await asyncio.wait_for(waiting, 1) is False
    assert await s0.fresh("ex")  # reloaded once; fresh until worker 1 records again
    assert await s0.fresh("other") is False  # an execution never served here is not trusted


async def test_a_dead_workers_unwritten_records_stop_blocking_after_recover(tmp_path: Path) -> None:
    t0, t1 = tables(tmp_path / "t")
    s0 = WorkerSync(t0, wait_s=5)
    t1.staged("ex")  # worker 1 died before writing it
    t1.close()
    restarted = WorkerTable(tmp_path / "t", workers=2, index=1, slots=1024)
    restarted.recover()
    assert await asyncio.wait_for(s0.fresh("ex"), 1) is False


async def test_the_wait_for_records_is_bounded(tmp_path: Path) -> None:
    t0, t1 = tables(tmp_path / "t")
    t1.staged("ex")  # never written
    assert await WorkerSync(t0, wait_s=0.05).fresh("ex") is False


def test_slots_agree_across_processes_and_bad_tables_are_refused(tmp_path: Path) -> None:
    t0, t1 = tables(tmp_path / "t")
    assert (
        t0.slot("ex-1")
        == t1.slot("ex-1")
        == WorkerTable(tmp_path / "t", workers=2, index=0, slots=1024).slot("ex-1")
    )
    with pytest.raises(ServerStartError, match="not a table"):
        WorkerTable(tmp_path / "t", workers=3, index=0, slots=1024)
    with pytest.raises(ServerStartError, match="worker index"):
        WorkerTable(tmp_path / "t", workers=2, index=2, slots=1024)
    with pytest.raises(ServerStartError, match="cannot map"):
        WorkerTable(tmp_path / "missing", workers=2, index=0)
