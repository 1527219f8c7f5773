"""Starting the K cell processes of a run on one machine, and stopping them.

A `CellCluster` is a context manager over the processes of K cells (one each, or TP x PP each) (forkserver by default: torch is imported
once in the server, each cell forks from it). It does not decide anything: the cells coordinate
through Redis and torch.distributed. `kill` sends SIGKILL, the way a cell dies in a crash test.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import signal
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from gyre_train.cells.cell import BurstPlan, CellConfig, run_cell
from gyre_train.exceptions import CellFailedError


class CellCluster:
    """K cell processes, started on enter, joined (or terminated) on exit."""

    def __init__(
        self, configs: Sequence[CellConfig], bursts: Sequence[BurstPlan], *, start_method: str = "forkserver"
    ) -> None:
        self._configs = list(configs)
        self._bursts = tuple(bursts)
        self._context: Any = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._context.set_forkserver_preload(["gyre_train.cells.cell"])
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._killed: set[int] = set()

    def __enter__(self) -> Self:
        for config in self._configs:
            process = self._context.Process(
                target=run_cell,
                args=(config, self._bursts),
                name=f"gyre-cell-{config.cell}.{config.position}",
            )
            process.start()
            self._processes.append(process)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for process in self._processes:
            if process.is_alive():
                process.terminate()
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
            process.close()

    def _of(self, cell: int) -> list[multiprocessing.process.BaseProcess]:
        processes = [p for c, p in zip(self._configs, self._processes, strict=True) if c.cell == cell]
        if not processes:
            raise CellFailedError(f"cell {cell} has not started")
        return processes

    def pids(self, cell: int) -> list[int]:
        """The process ids of one cell (its leader first)."""
        pids = [p.pid for p in self._of(cell)]
        if None in pids:
            raise CellFailedError(f"cell {cell} has not started")
        return [pid for pid in pids if pid is not None]

    def kill(self, cell: int) -> None:
        """SIGKILL every process of one cell (no cleanup, no goodbye: its claims stay pending)."""
        for pid in self.pids(cell):
            os.kill(pid, signal.SIGKILL)
        for process in self._of(cell):
            process.join()
        self._killed.add(cell)

    def wait(self, timeout_s: float) -> None:
        """Wait for every cell not killed; raises CellFailedError on a failure or a timeout."""
        deadline = time.monotonic() + timeout_s
        for config, process in zip(self._configs, self._processes, strict=True):
            if config.cell in self._killed:
                continue
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            where = f"cell {config.cell}" + (f" (position {config.position})" if config.position else "")
            if process.is_alive():
                raise CellFailedError(f"{where} did not finish within {timeout_s} s")
            if process.exitcode != 0:
                raise CellFailedError(f"{where} exited with code {process.exitcode}")
