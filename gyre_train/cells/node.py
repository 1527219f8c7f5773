"""The node agent: starts and supervises one machine's share of a live run's cells.

A node runs some rollout engines (each a process: ``rollout.rollout_process``) and some
trainer cells (processes of ``processes.run_live_cell``, or elastic cells that are engines and
trainers in turn: ``processes.run_elastic_cell``). An engine that dies is started
again, after a pause that doubles up to a ceiling; it registers again with its new URL and
loads the newest policy itself. Trainer cells share one torch.distributed world that cannot
take a restarted member, so a trainer that dies is not restarted here: a satellite's death
leaves the core to take over its work (streaming training's take-over), the core's ends this
agent's training, and ``failed`` says which (``gyre node serve`` then starts a new trainer
world in an agent of its own, beside the engines' agent). Whatever a cluster uses to start processes starts one
node agent per machine; the agents find each other through the log and Redis only.
"""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import multiprocessing.process
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gyre_train.cells.cell import CellConfig
from gyre_train.cells.elastic import ElasticConfig
from gyre_train.cells.live import LiveTraining
from gyre_train.cells.membership import CORE
from gyre_train.cells.processes import run_elastic_cell, run_live_cell
from gyre_train.cells.rollout import RolloutEngineConfig, rollout_process


@dataclass(frozen=True, slots=True)
class TrainerPlan:
    """The trainer cells this node runs, and what they train. With ``elastic`` set they are
    elastic cells (elastic.py): each also hosts the rollout engine ``engines[i]`` and moves
    between the roles as the controller says."""

    cells: tuple[CellConfig, ...]
    training: LiveTraining
    publish_dir: Path
    first_step: int
    version: int
    elastic: ElasticConfig | None = None
    engines: tuple[RolloutEngineConfig, ...] = ()
    world: str = ""  # the world of trainer cells these belong to (``trainer.world_started``)


@dataclass(frozen=True, slots=True)
class NodePlan:
    """One node's share of a run: its engines and its trainer cells (either may be empty)."""

    engines: tuple[RolloutEngineConfig, ...] = ()
    trainers: TrainerPlan | None = None
    restart_pause_s: float = 1.0
    restart_pause_max_s: float = 30.0


@dataclass
class _Supervised:
    name: str
    start: Callable[[], multiprocessing.process.BaseProcess]
    process: multiprocessing.process.BaseProcess
    restart: bool
    pause_s: float
    restarts: int = 0
    down_since: float | None = None


@dataclass
class NodeAgent:
    """Runs a ``NodePlan``: a context manager; ``supervise(stop)`` until stopped."""

    plan: NodePlan
    context: str = "spawn"
    failed: list[str] = field(default_factory=list)  # trainers that died, "cell-<i> (exit <code>)"
    _children: list[_Supervised] = field(default_factory=list)

    def __enter__(self) -> NodeAgent:
        ctx = multiprocessing.get_context(self.context)
        for engine in self.plan.engines:
            self._children.append(self._start(ctx, engine.engine, (rollout_process, (engine,)), restart=True))
        trainers = self.plan.trainers
        if trainers is not None:
            shared = (trainers.training, trainers.publish_dir, trainers.first_step, trainers.version)
            for i, cell in enumerate(trainers.cells):
                target: tuple[Callable[..., None], tuple[object, ...]] = (run_live_cell, (cell, *shared))
                if trainers.elastic is not None:
                    target = (run_elastic_cell, (cell, *shared, trainers.elastic, trainers.engines[i]))
                name = f"cell-{cell.cell}" + (f".{cell.position}" if cell.position else "")  # FSDP ranks
                self._children.append(self._start(ctx, name, target, restart=False))
        return self

    def _start(
        self,
        ctx: multiprocessing.context.BaseContext,
        name: str,
        target: tuple[Callable[..., None], tuple[object, ...]],
        *,
        restart: bool,
    ) -> _Supervised:
        def start() -> multiprocessing.process.BaseProcess:
            process: multiprocessing.process.BaseProcess = ctx.Process(  # type: ignore[attr-defined]
                target=_child, args=(target[0], target[1]), name=f"gyre-{name}", daemon=False
            )
            process.start()
            return process

        return _Supervised(name, start, start(), restart, self.plan.restart_pause_s)

    def pids(self) -> dict[str, int | None]:
        return {child.name: child.process.pid for child in self._children}

    def alive(self, name: str) -> bool:
        return any(c.name == name and c.process.is_alive() for c in self._children)

    @property
    def core_done(self) -> bool:
        """Whether this node ran the core and its process has ended (trained or died)."""
        return any(c.name == f"cell-{CORE}" and not c.process.is_alive() for c in self._children)

    def step(self) -> None:
        """Restart engines that died (after their pause); note trainers that died."""
        now = time.monotonic()
        for child in self._children:
            if child.process.is_alive():
                continue
            code = child.process.exitcode
            if not child.restart:
                note = f"{child.name} (exit {code})"
                if code not in (0, None) and note not in self.failed:
                    self.failed.append(note)
                continue
            if child.down_since is None:
                child.down_since = now
            if now - child.down_since >= child.pause_s:
                child.process = child.start()
                child.restarts += 1
                child.down_since = None
                child.pause_s = min(child.pause_s * 2, self.plan.restart_pause_max_s)

    def supervise(self, stop: threading.Event, *, poll_s: float = 0.2) -> None:
        while not stop.is_set():
            self.step()
            stop.wait(poll_s)

    def restarts(self) -> dict[str, int]:
        return {child.name: child.restarts for child in self._children}

    def __exit__(self, *exc: object) -> None:
        stop_processes([child.process for child in self._children])


def stop_processes(procs: Sequence[multiprocessing.process.BaseProcess], grace_s: float = 10.0) -> None:
    """Terminate processes, then kill what is still alive after ``grace_s``."""
    for process in procs:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in procs:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(5)


def _child(target: Callable[..., None], args: tuple[object, ...]) -> None:
    """A supervised process: it ends with its node agent, however the agent ends (Linux), so a
    node started again never meets the cells of its previous life."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: its threads' stacks
    target(*args)
