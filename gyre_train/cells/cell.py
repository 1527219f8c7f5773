"""A cell leader: its config, its burst plan, its seams, and the work core and satellites share.

Every cell is a process (or a Megatron group of them, see replica.py) with its own replica; cell
0, the core, holds the authoritative weights and the only optimizer. A `Cell` runs on four seams:
the claim queue of each batch (`MicroStepQueue`), the run's `BatchBoard`, its model
(`CellReplica`) and the event log, so the loops of core.py and satellite.py run the same on Redis
and torch.distributed as on the in-memory queue and a fake replica in tests. Building the real
seams from a URL is the process entry point's job (`run_cell`, processes.py), not this module's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from gyre_store import EventLog, NewEvent
from gyre_store.catalog import CellRole, CellRoleChanged, MicroStepClaimed, MicroStepComputed
from gyre_store.log import Event, EventMetadata
from gyre_train.backends import OptimizerConfig
from gyre_train.cells.board import BatchBoard
from gyre_train.cells.claims import MicroStepQueue, Phase, QueueConfig, Task
from gyre_train.cells.membership import ReducePlan
from gyre_train.cells.metrics import CellMetrics
from gyre_train.cells.publish import EnginePublisherConfig, WeightPublisher
from gyre_train.cells.replica import CellModel, RankLayout, TorchCells, layout_of
from gyre_train.cells.wire import RatioShare
from gyre_train.exceptions import CellFailedError, InvalidConfigError
from gyre_train.objective import ExecutionClip, LossConfig
from gyre_train.trajectories import MicroStep

T = TypeVar("T")

DIST_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True, slots=True)
class BurstPlan:
    """Consecutive batches trained before one publication, and when satellites join.

    `joins[s] = (p, n)`: satellite s joins the burst's p-th batch once n micro-step claims of it
    were handed out, and stays until the burst ends (then returns to rollout).
    """

    batches: tuple[int, ...]
    joins: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    core_stays: bool = True  # at the burst end: stay in training, or return to rollout


@dataclass(frozen=True, slots=True)
class CellConfig:
    """Everything one cell process is built from (picklable: it crosses a process start)."""

    run_id: str
    cell: int
    cells: int  # K
    redis_url: str
    dist_init: str  # e.g. tcp://127.0.0.1:29500, shared by every process of the K cells
    queue: QueueConfig
    model: CellModel
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    transport: str = "torch"
    dist_backend: str = "gloo"
    database_url: str | None = None
    engines: EnginePublisherConfig | None = None
    # The core writes the batch gradient it applies and its parameters after each update here.
    output_dir: Path | None = None
    step_delay_s: float = 0.0  # slows each gradient micro-step (tests of slow and dying cells)
    wait_timeout_s: float = 120.0
    position: int = 0  # this process's place inside its cell (0: the leader)
    # The network interface gloo talks to the other cells on (GLOO_SOCKET_IFNAME): the one that
    # holds this machine's advertised address when the cells span machines; None: gloo's choice.
    dist_interface: str | None = None
    # The address other machines reach this process at: where its Mooncake Transfer Engine
    # says its exposed snapshot is (transport "mooncake"); the cell's own machine by default.
    transport_host: str = "127.0.0.1"
    # Where the leader serves the cell's Prometheus metrics (CellMetrics); None: not served.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        layout_of(self.model, self.cells, self.cell, self.position)  # raises on a bad place
        if self.dist_backend not in DIST_BACKENDS:
            raise InvalidConfigError(
                f"dist_backend must be one of {list(DIST_BACKENDS)}, got {self.dist_backend!r}"
            )
        if self.dist_backend == "nccl" and self.device == "cpu":
            # NCCL collectives move CUDA tensors: only cells whose model lives on a GPU use them.
            raise InvalidConfigError(
                "cells over nccl train on a GPU: set the device to 'cuda' (only unsharded PyTorch "
                "cells have one; fsdp and megatron cells run over gloo on the CPU)"
            )

    @property
    def device(self) -> str:
        """Where this cell's model lives: an unsharded PyTorch cell's `training.device`, else "cpu"."""
        return self.model.training.device if isinstance(self.model, TorchCells) else "cpu"

    @property
    def layout(self) -> RankLayout:
        return layout_of(self.model, self.cells, self.cell, self.position)


class CellReplica(Protocol):
    """A cell's model as its leader drives it: `Replica` (replica.py) across the cell's ranks."""

    def ratio(self, step: MicroStep) -> RatioShare:
        """Pass 1 of one micro-step."""
        ...

    def gradient(self, step: MicroStep, clip: ExecutionClip) -> float:
        """Pass 2 of one micro-step into the accumulated gradients; returns its loss share."""
        ...

    def zero_gradients(self) -> None: ...

    def reduce(self, plan: ReducePlan, loss: float) -> float | None:
        """Sum the plan's prefix's gradients and loss shares onto the core; returns the summed
        loss, or None when a member failed inside the collective (the accumulated gradients are
        untouched, so they can be reduced again)."""
        ...

    def update(self) -> float:
        """Core: one optimizer step on the reduced batch gradient; returns the gradient norm."""
        ...

    def save_gradient(self, directory: Path, policy_version: int) -> None:
        """Core, between reduce and update: the reduced batch gradient as `grads-v<version>.pt`."""
        ...

    def expose(self, policy_version: int) -> None:
        """Core: the current weights become the snapshot joiners pull and the broadcast sends."""
        ...

    def broadcast(self, plan: ReducePlan) -> None:
        """The core's snapshot to every member of the plan's prefix (core and satellites call it)."""
        ...

    def serve(self) -> None:
        """Core: answer pending snapshot pulls."""
        ...

    def pull(self, policy_version: int, timeout_s: float) -> None:
        """Satellite: load the core's snapshot at `policy_version`."""
        ...

    def save(self, directory: Path, policy_version: int) -> None:
        """Core: the weights after an update, as `params-v<version>.pt`."""
        ...

    def publish(self, publisher: WeightPublisher, policy_version: int) -> None: ...


class _Recorder:
    """Appends this cell's events when a database is configured (a no-op otherwise), after
    counting each in the cell's metrics."""

    def __init__(self, log: EventLog | None, run_id: str, metrics: CellMetrics) -> None:
        self._log = log
        self._meta = EventMetadata(run_id=run_id)
        self._metrics = metrics

    def __call__(self, *events: Event, keys: tuple[str | None, ...] = ()) -> None:
        for event in events:
            self._metrics.observe(event)
        if self._log is None or not events:
            return
        keyed = keys or (None,) * len(events)
        self._log.append(
            [NewEvent(e, idempotency_key=k, metadata=self._meta) for e, k in zip(events, keyed, strict=True)]
        )


class Cell:
    """One cell leader's state: its seams (queues, board, replica, recorder) and policy version.

    `queues(batch)` gives the claim queue of a batch; queues of one run and `board` share the
    heartbeats. `log` is where the cell's events go (None: nowhere).
    """

    def __init__(
        self,
        config: CellConfig,
        log: EventLog | None,
        queues: Callable[[int], MicroStepQueue],
        board: BatchBoard,
        replica: CellReplica,
    ) -> None:
        self.config = config
        self.metrics = CellMetrics(config.cell)  # served by the process when a port is configured
        self.record = _Recorder(log, config.run_id, self.metrics)
        self.board = board
        self.replica = replica
        self.version = 0
        self._queues = queues
        self._steps: dict[tuple[int, int], MicroStep] = {}

    # -- shared by core and satellites ---------------------------------------------------------

    def _step(self, queue: MicroStepQueue, index: int) -> MicroStep:
        key = (queue.batch, index)
        if key not in self._steps:
            self._steps = {k: v for k, v in self._steps.items() if k[0] == queue.batch}
            self._steps[key] = queue.micro_step(index)
        return self._steps[key]

    def process(
        self, queue: MicroStepQueue, task: Task, held: dict[str, int], clip: ExecutionClip | None
    ) -> float:
        """Compute one claimed task; returns the loss share (0 for pass 1)."""
        c = self.config
        step = self._step(queue, task.index)
        self.record(
            MicroStepClaimed(
                run_id=c.run_id,
                batch=queue.batch,
                micro_step=task.index,
                phase=int(task.phase),
                cell=c.cell,
                deliveries=task.deliveries,
            )
        )
        if task.phase is Phase.RATIOS:
            # Pass-1 shares are keyed by micro-step, first write wins: a redelivered task that
            # computes it again changes nothing, so the claim is acknowledged at once.
            began = time.perf_counter()
            share = self.replica.ratio(step)
            self._computed(queue.batch, task, step, time.perf_counter() - began)
            queue.put_ratio(share)
            queue.ack([task.message_id])
            return 0.0
        if c.step_delay_s:
            time.sleep(c.step_delay_s)
        # Renewing proves the claim is still ours right before the gradient enters the replica;
        # a claim taken over meanwhile is dropped here, never accumulated twice.
        if task.message_id not in queue.renew(c.cell, [task.message_id]):
            return 0.0
        assert clip is not None  # gradient tasks exist only after the clip was stored
        began = time.perf_counter()
        loss = self.replica.gradient(step, clip)
        self._computed(queue.batch, task, step, time.perf_counter() - began)
        held[task.message_id] = task.index
        return loss

    def _computed(self, batch: int, task: Task, step: MicroStep, seconds: float) -> None:
        c = self.config
        self.record(
            MicroStepComputed(
                run_id=c.run_id,
                batch=batch,
                micro_step=task.index,
                phase=int(task.phase),
                cell=c.cell,
                seconds=seconds,
                tokens=len(step),
            )
        )

    def wait_for(self, what: str, probe: Callable[[], T | None]) -> T:
        deadline = time.monotonic() + self.config.wait_timeout_s
        while (value := probe()) is None:
            if time.monotonic() > deadline:
                raise CellFailedError(
                    f"cell {self.config.cell}: no {what} within {self.config.wait_timeout_s} s"
                )
            time.sleep(self.config.queue.poll_s)
        return value

    def role(self, role: CellRole, previous: CellRole, reason: str) -> None:
        c = self.config
        self.record(
            CellRoleChanged(run_id=c.run_id, cell_index=c.cell, role=role, previous=previous, reason=reason)
        )

    def queue(self, batch: int) -> MicroStepQueue:
        return self._queues(batch)
