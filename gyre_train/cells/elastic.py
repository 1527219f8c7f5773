"""An elastic cell of a live run: one process that is a rollout engine or a trainer, and moves
between the two when the controller says so, without leaving the cells' torch.distributed world.

The process joins the world of the K cells once and keeps its trainer replica for its whole
life (the core also its optimizer, its packing thread and its publisher). In the rollout role
it serves the run's newest policy from an in-process engine registered as ``<run>:cell-<i>``.
It follows its ``cell.command`` events in log order, carries each out, and records
``cell.step_done`` as each completes, then ``cell.transition_done`` at the end of a transition:

- to training: ``drain`` (the engine takes no new requests), ``reroute`` (the proxy moves the
  engine's requests in flight to their new engines; whatever is left after a grace is
  aborted, and the proxy retries it elsewhere), ``release`` (the engine stops: its weights, KV
  caches and buffers are dropped), ``restore`` (the training state; on the CPU the replica
  stays resident, so this zeroes its gradients), then the transition is done and the cell
  trains the open batch and the rest of its burst: the core opens the batch, a satellite joins
  it and pulls the core's snapshot (``join``);
- after the core's last update of a burst: ``core_stays`` trains the next burst;
- to rollout: ``release_training`` (gradients dropped), ``restore_rollout`` (a new engine loads
  the newest published policy and registers), then done.

What is not here: deciding anything (the controller does), the training loops (core.py and
satellite.py, run one burst at a time), and building the seams (processes.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from gyre_store import (
    BatchClosed,
    CellCommand,
    CellStep,
    CellStepDone,
    CellTransitionDone,
    EventLog,
    EventMetadata,
    FaultPoint,
    NewEvent,
    StreamId,
    read_to_head,
)
from gyre_train.cells.cell import BurstPlan, Cell
from gyre_train.cells.core import run_core
from gyre_train.cells.membership import CORE
from gyre_train.cells.publish import WeightPublisher
from gyre_train.cells.satellite import run_satellite
from gyre_train.exceptions import CellFailedError


class CellEngine(Protocol):
    """A cell's rollout engine as its runtime drives it (``rollout.RolloutEngine``)."""

    def start(self) -> None:
        """Serve the newest published policy and register."""

    def stop(self) -> None:
        """Stop serving and drop the model."""

    def stop_accepting(self) -> None:
        """Refuse new requests; those in flight go on."""

    def in_flight(self) -> int:
        """Requests still being decoded."""
        ...

    def abort_all(self) -> None:
        """Abort every request in flight."""


@dataclass(frozen=True, slots=True)
class ElasticConfig:
    """How an elastic cell follows its commands and how much of the run it trains."""

    steps: int  # the run's training steps
    mu: int  # steps per burst
    reroute_grace_s: float = 30.0  # for the proxy to move requests in flight; the rest are aborted
    poll_s: float = 0.05
    train_threads: int = 0  # torch threads while training (0: as many as at the start)


class ElasticCell:
    """The command loop of one elastic cell; ``run(stop)`` until stopped or the run is trained."""

    def __init__(
        self,
        cell: Cell,
        log: EventLog,
        engine: CellEngine,
        config: ElasticConfig,
        *,
        publisher: WeightPublisher | None = None,
        in_training: threading.Event | None = None,
        fault: FaultPoint | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.cell = cell
        self.log = log
        self.engine = engine
        self.config = config
        self.publisher = publisher
        self.fault = fault  # fault tests: die as this cell starts a step (gyre_store.faults)
        self._clock = clock
        self._index = cell.config.cell
        self._run_id = cell.config.run_id
        self._meta = EventMetadata(run_id=self._run_id)
        self._stream = StreamId("cellcmd", f"{self._run_id}/{self._index}")
        self._threads = config.train_threads or torch.get_num_threads()
        self._in_training = in_training or threading.Event()  # set while the cell trains
        self.serving = False

    @property
    def training(self) -> bool:
        return self._in_training.is_set()

    @training.setter
    def training(self, value: bool) -> None:
        if value:
            self._in_training.set()
        else:
            self._in_training.clear()

    # -- the log -------------------------------------------------------------------------------

    def _pending(self) -> list[CellCommand]:
        """This cell's commands not yet done, in log order (a cell started again resumes here)."""
        commands: list[CellCommand] = []
        done: set[tuple[int, CellStep]] = set()
        for recorded in self.log.read_stream(self._stream):
            event = recorded.event
            if isinstance(event, CellCommand):
                commands.append(event)
            elif isinstance(event, CellStepDone):
                done.add((event.transition, event.step))
        return [c for c in commands if (c.transition, c.step) not in done]

    def _done(
        self, command: CellCommand, step: CellStep, began: float, detail: str = "", batch: int | None = None
    ) -> None:
        event = CellStepDone(
            run_id=self._run_id,
            cell_index=self._index,
            step=step,
            transition=command.transition,
            seconds=max(0.0, self._clock() - began),
            detail=detail,
            batch=batch,
        )
        key = f"cell-step:{self._run_id}/{self._index}/{command.transition}/{step.value}"
        self.log.append([NewEvent(event, key, metadata=self._meta)])

    def _transition_done(self, command: CellCommand) -> None:
        done = CellTransitionDone(run_id=self._run_id, cell_index=self._index)
        key = f"transition-done:{self._run_id}/{self._index}/{command.transition}"
        self.log.append([NewEvent(done, key, metadata=self._meta)])

    def _closed_steps(self) -> int:
        """Batches of the run whose update is recorded (the open batch is the next one)."""
        events, _ = read_to_head(self.log, 0, types=["batch.closed"])
        return len(
            {
                e.event.step
                for e in events
                if isinstance(e.event, BatchClosed) and e.event.run_id == self._run_id
            }
        )

    # -- the loop ------------------------------------------------------------------------------

    def _recovered(self) -> tuple[bool, CellCommand | None]:
        """Where the cell's completed steps left it: serving rollout (every cell starts there),
        and the command whose training it was in, if it had not released it and its burst is
        not over (a cell that died between its burst's end and its next command waits for it)."""
        serving, training, joined = True, None, None
        commands = {}
        for recorded in self.log.read_stream(self._stream):
            event = recorded.event
            if isinstance(event, CellCommand):
                commands[(event.transition, event.step)] = event
            elif isinstance(event, CellStepDone):
                match event.step:
                    case CellStep.DRAIN:
                        serving = False
                    case CellStep.RESTORE_ROLLOUT:
                        serving = True
                    case CellStep.RESTORE | CellStep.CORE_STAYS:
                        training, joined = commands.get((event.transition, event.step)), None
                    case CellStep.JOIN:
                        joined = event.batch
                    case CellStep.RELEASE_TRAINING:
                        training = None
        if training is not None and joined is not None:
            mu = self.config.mu
            if self._open_step() // mu != joined // mu:
                training = None  # that burst is trained: the controller's next command decides
        return serving, training

    def _open_step(self) -> int:
        """The batch this cell would train next: the core's from its version, a satellite's the
        run's first batch whose update is not recorded."""
        return self.cell.version if self._index == CORE else self._closed_steps()

    def run(self, stop: threading.Event) -> None:
        """Carry out this cell's commands until ``stop`` is set. A cell started again takes up
        its role where its completed steps left it (training resumes the open burst)."""
        serving, training = self._recovered()
        if serving:
            self.engine.start()
            self.serving = True
        if training is not None:
            self.training = True
            self._train(training)
        try:
            while not stop.is_set():
                head = self.log.head()  # before reading: a command appended after it wakes the wait
                pending = self._pending()
                if not pending:
                    self.log.wait(head, self.config.poll_s * 20)
                    continue
                for command in pending:
                    if stop.is_set():
                        return
                    self.carry_out(command)
        finally:
            if self.serving:
                self.engine.stop()
                self.serving = False

    def carry_out(self, command: CellCommand) -> None:
        """One command: its step, recorded once it completed (and the training it opens)."""
        if self.fault is not None:
            self.fault.reached(f"cell-{self._index}:{command.step.value}")
        began = self._clock()
        match command.step:
            case CellStep.DRAIN:
                self.engine.stop_accepting()
                self._done(command, CellStep.DRAIN, began)
            case CellStep.REROUTE:
                aborted = self._reroute()
                detail = (
                    f"{aborted} requests aborted after {self.config.reroute_grace_s:.0f} s" if aborted else ""
                )
                self._done(command, CellStep.REROUTE, began, detail)
            case CellStep.RELEASE:
                if self.serving:
                    self.engine.stop()
                    self.serving = False
                self._done(command, CellStep.RELEASE, began)
            case CellStep.RESTORE:
                torch.set_num_threads(self._threads)  # the engine's decode loop set one thread
                self.cell.replica.zero_gradients()
                self.training = True
                self._done(command, CellStep.RESTORE, began)
                self._transition_done(command)
                self._train(command)
            case CellStep.CORE_STAYS:
                self._done(command, CellStep.CORE_STAYS, began)
                self._train(command)
            case CellStep.RELEASE_TRAINING:
                self.cell.replica.zero_gradients()
                self.training = False
                self._done(command, CellStep.RELEASE_TRAINING, began)
            case CellStep.RESTORE_ROLLOUT:
                if not self.serving:
                    self.engine.start()
                    self.serving = True
                self._done(command, CellStep.RESTORE_ROLLOUT, began)
                self._transition_done(command)
            case CellStep.JOIN:
                raise CellFailedError(f"cell {self._index}: join is a step the cell records, not a command")

    def _reroute(self) -> int:
        """Wait until the proxy has moved every request in flight; abort what is left after the
        grace (the proxy then retries it elsewhere). Returns how many were aborted."""
        deadline = self._clock() + self.config.reroute_grace_s
        while self.engine.in_flight() and self._clock() < deadline:
            time.sleep(self.config.poll_s)
        left = self.engine.in_flight()
        if left:
            self.engine.abort_all()
            while self.engine.in_flight():
                time.sleep(self.config.poll_s)
        return left

    def _train(self, command: CellCommand) -> None:
        """Train the open batch and the rest of its burst, in this cell's role (core or satellite);
        record ``join`` once the cell is in the batch."""
        c = self.config
        step = self._open_step()
        if step >= c.steps:
            return  # the run is trained: nothing left to join
        last = min((step // c.mu + 1) * c.mu, c.steps)
        batches = tuple(range(step, last))
        began = self._clock()

        def joined(batch: int) -> None:
            self._done(command, CellStep.JOIN, began, f"batch {batch}", batch=batch)

        if self._index == CORE:
            self.training = True  # packing resumes (after a core_stays decision too)
            run_core(self.cell, (BurstPlan(batches),), self.publisher, record_roles=False, on_join=joined)
            # The burst is published: the next batch is packed only once the controller has
            # decided about the core (it stays, or returns to rollout and claims nothing more).
            self.training = False
        else:
            burst = BurstPlan(batches, joins={self._index: (0, 0)})
            run_satellite(self.cell, (burst,), record_roles=False, on_join=joined)
