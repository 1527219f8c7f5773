"""Several proxy processes on one port: keeping each worker's per-execution caches coherent.

Any worker may serve any execution. Each keeps an execution's matching context and token
sequences in memory, and they go stale when another worker records a call of that execution.
The workers share a small file-backed table: per execution slot (a stable hash of the
execution id) and per worker, how many records that worker has staged and how many its spool
has written. Each worker writes only its own column, so no lock is needed. Before answering,
a worker compares the other workers' staged count for the execution's slot with the one it
saw last; if it moved, it waits until their written count catches up (the records are in
the log) and drops its caches, which are then reloaded from the log. Records are counted as
staged before the harness receives the end of the answer, so a harness's next call always
finds its previous one counted. Two executions sharing a slot cost a needless reload, never
a wrong answer. Not here: starting the workers (``gyre proxy serve --workers N``) and the
shared socket.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import mmap
import os
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gyre_proxy.exceptions import ServerStartError

log = logging.getLogger(__name__)

DEFAULT_SLOTS = 1 << 16
STAGED, WRITTEN = 0, 1


class WorkerTable:
    """The shared counters, ``[slot, worker, staged | written]`` int64 in a file mapped by every
    worker; worker ``index`` writes only its own column."""

    def __init__(self, path: Path, *, workers: int, index: int, slots: int = DEFAULT_SLOTS) -> None:
        if not 0 <= index < workers:
            raise ServerStartError(f"worker index {index} is not in 0..{workers - 1}")
        size = slots * workers * 2 * 8
        try:
            with path.open("r+b") as f:
                if os.fstat(f.fileno()).st_size != size:
                    raise ServerStartError(f"{path} is not a table of {workers} workers x {slots} slots")
                self._map = mmap.mmap(f.fileno(), size)
        except OSError as exc:
            raise ServerStartError(f"cannot map the workers' table {path}: {exc}") from exc
        self.counts: npt.NDArray[np.int64] = np.frombuffer(self._map, dtype=np.int64).reshape(
            slots, workers, 2
        )
        self.index = index
        self.slots = slots
        self._others = [w for w in range(workers) if w != index]

    @staticmethod
    def create(path: Path, *, workers: int, slots: int = DEFAULT_SLOTS) -> None:
        """Write an all-zero table for ``workers`` workers at ``path``."""
        with path.open("wb") as f:
            f.truncate(slots * workers * 2 * 8)

    def slot(self, execution_id: str) -> int:
        # Python's hash() differs between processes; the workers must agree on slots.
        digest = hashlib.blake2b(execution_id.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.slots

    def staged(self, execution_id: str) -> None:
        self.counts[self.slot(execution_id), self.index, STAGED] += 1

    def written(self, execution_id: str) -> None:
        self.counts[self.slot(execution_id), self.index, WRITTEN] += 1

    def others(self, slot: int) -> tuple[int, int]:
        """Records the other workers staged and wrote for executions of ``slot``."""
        row = self.counts[slot, self._others]
        return int(row[:, STAGED].sum()), int(row[:, WRITTEN].sum())

    def recover(self) -> None:
        """Start this worker's column over: what a predecessor at this index staged and never
        wrote is lost, and no other worker should wait for it."""
        mine = self.counts[:, self.index]
        mine[:, WRITTEN] = mine[:, STAGED]

    def close(self) -> None:
        del self.counts
        self._map.close()


class WorkerSync:
    """The pipeline's view of the table (``AnswerPipeline(sync=...)``): is this worker's cache of
    an execution still good, and count what it stages and writes."""

    def __init__(self, table: WorkerTable, *, wait_s: float = 10.0, remember: int = 1 << 16) -> None:
        self.table = table
        self.wait_s = wait_s
        self.remember = remember
        self.reloads = 0
        self._seen: OrderedDict[str, int] = OrderedDict()

    async def fresh(self, execution_id: str) -> bool:
        """True when no other worker recorded a call of ``execution_id`` (or of its slot) since
        this worker last served it. Otherwise waits until those records are written (at most
        ``wait_s``: a worker that died with records unwritten lost them) and returns False:
        the caller drops its caches of the execution."""
        slot = self.table.slot(execution_id)
        staged, written = self.table.others(slot)
        if self._seen.get(execution_id) == staged:
            self._seen.move_to_end(execution_id)
            return True
        deadline = time.monotonic() + self.wait_s
        while written < staged:
            if time.monotonic() > deadline:
                log.warning(
                    "%s: other workers' records were not written in %.0f s", execution_id, self.wait_s
                )
                break
            await asyncio.sleep(0.001)
            written = self.table.others(slot)[1]
        self._seen[execution_id] = staged
        self._seen.move_to_end(execution_id)
        while len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        self.reloads += 1
        return False

    def staged(self, execution_id: str) -> None:
        self.table.staged(execution_id)

    def written(self, execution_id: str) -> None:
        self.table.written(execution_id)
