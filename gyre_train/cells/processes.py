"""A cell process and the K of them on one machine: `run_cell` and `CellCluster`.

`run_cell` is one process's entry point, and the only place the cells' seams are built for real:
it joins the torch.distributed world of the K cells, opens its backend, and (as a cell's leader)
connects the Redis claim queues and board, the event log, the weight transport and the
publisher, then runs the core's or a satellite's loop (`run_live_cell` for a live run's trainer
cells; `run_elastic_cell` for its elastic cells, which also host their rollout engine and follow
their commands, elastic.py). A `CellCluster` is a context manager over
the processes of K cells (one each, or TP x PP each; forkserver by default: torch is imported
once in the server, each cell forks from it). It decides nothing: the cells coordinate through
Redis and torch.distributed. `kill` sends SIGKILL, the way a cell dies in a crash test.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis
import torch
import torch.distributed as dist

from gyre_store import (
    EventLog,
    EventMetadata,
    FaultPoint,
    NewEvent,
    PostgresEventLog,
    PostgresProjectionStore,
    ProjectionSet,
    StoreConfig,
    TrainerTransportStarted,
    evaluation_projections,
)
from gyre_store.trees import TreeProjection
from gyre_train.cells.board import RedisBatchBoard
from gyre_train.cells.cell import BurstPlan, Cell, CellConfig
from gyre_train.cells.claims import RedisMicroStepQueue
from gyre_train.cells.core import run_core
from gyre_train.cells.elastic import ElasticCell, ElasticConfig
from gyre_train.cells.live import LivePublisher, LiveTraining, bursts_from, feed_batches
from gyre_train.cells.membership import CORE
from gyre_train.cells.publish import EnginePublisher
from gyre_train.cells.replica import Replica, open_backend
from gyre_train.cells.rollout import RolloutEngine, RolloutEngineConfig
from gyre_train.cells.satellite import run_satellite
from gyre_train.cells.transport import make_transport
from gyre_train.exceptions import CellFailedError, InvalidConfigError


def run_cell(config: CellConfig, bursts: tuple[BurstPlan, ...]) -> None:
    """Entry point of one process: join the world of the K cells, then train as core or satellite
    (the cell's leader) or mirror the leader's model operations (any other rank of the cell)."""
    _run(config, bursts, None)


def run_live_cell(
    config: CellConfig, training: LiveTraining, publish_dir: Path, first_step: int, version: int
) -> None:
    """Entry point of one trainer process of a live run: as `run_cell`, over the bursts of steps
    `first_step` .. `training.steps - 1`, the core also packing the batches from the trajectory
    database and publishing to the run's engines. `version` is the policy it starts from."""
    satellites = config.cells - 1
    bursts = bursts_from(first_step, training.steps, training.mu, satellites)
    _run(config, bursts, _Live(training, publish_dir, first_step, version))


def run_elastic_cell(
    config: CellConfig,
    training: LiveTraining,
    publish_dir: Path,
    first_step: int,
    version: int,
    elastic: ElasticConfig,
    engine: RolloutEngineConfig,
) -> None:
    """Entry point of one elastic cell of a live run (elastic.py): the world and the replica as
    `run_live_cell` builds them, and the cell's rollout engine, driven by the cell's commands
    until the process is stopped."""
    _run(config, (), _Live(training, publish_dir, first_step, version, elastic, engine))


@dataclass(frozen=True, slots=True)
class _Live:
    training: LiveTraining
    publish_dir: Path
    first_step: int
    version: int
    elastic: ElasticConfig | None = None
    engine: RolloutEngineConfig | None = None


def _run(config: CellConfig, bursts: tuple[BurstPlan, ...], live: _Live | None) -> None:
    layout = config.layout
    if config.dist_interface:
        os.environ["GLOO_SOCKET_IFNAME"] = config.dist_interface  # read when the group is made
    if config.device != "cpu" and not torch.cuda.is_available():
        raise InvalidConfigError(
            f"cell {config.cell}: device {config.device!r}, but torch sees no CUDA device here"
        )
    if config.device == "cuda":
        # "cuda": the machine's GPUs are taken round-robin by global rank (NCCL wants one per process).
        torch.cuda.set_device(layout.rank % torch.cuda.device_count())
    elif config.device.startswith("cuda:"):
        torch.cuda.set_device(torch.device(config.device))
    dist.init_process_group(
        config.dist_backend,
        init_method=config.dist_init,
        rank=layout.rank,
        world_size=layout.world,
        timeout=datetime.timedelta(seconds=config.wait_timeout_s),
    )
    with contextlib.ExitStack() as stack:
        stack.callback(dist.destroy_process_group)
        backend = stack.enter_context(open_backend(config.model, layout, config.optimizer))
        if not layout.leads:
            Replica(backend, layout, config.loss, None, None).follow()
            return
        client = redis.Redis.from_url(config.redis_url)
        stack.callback(client.close)
        log = (
            stack.enter_context(PostgresEventLog(StoreConfig(config.database_url)))
            if config.database_url
            else None
        )
        board = RedisBatchBoard(client, config.queue)
        transport = make_transport(config.transport, board, config.cell, host=config.transport_host)
        stack.callback(transport.close)
        if log is not None and transport.segment:
            _record_transport(log, config, transport.name, transport.segment)
        # The replica builds one group per participating prefix 2..K, once, on every process.
        replica = Replica(backend, layout, config.loss, transport, board)
        stack.callback(replica.stop)  # followers leave `follow()` however the leader ends
        queues = partial(RedisMicroStepQueue, client, config.queue)
        cell = Cell(config, log, queues, board, replica)
        if config.metrics_port is not None:
            stack.enter_context(cell.metrics.serve(host=config.metrics_host, port=config.metrics_port))
            print(f"cell {config.cell}: metrics at {cell.metrics.url}", file=sys.stderr, flush=True)
        if live is not None:
            cell.version = live.version
        if live is not None and live.elastic is not None:
            assert live.engine is not None  # run_elastic_cell gives both
            if log is None:
                raise CellFailedError("an elastic cell needs the run's database")
            # The core packs batches only while it trains (the supply check counts unclaimed groups).
            training = threading.Event()
            core_publisher = (
                _live_core(stack, config, log, queues, live, consuming=training.is_set)
                if config.cell == CORE
                else None
            )
            engine = RolloutEngine(live.engine, log)
            elastic = ElasticCell(
                cell, log, engine, live.elastic, publisher=core_publisher, in_training=training,
                fault=FaultPoint.from_env(),  # the fault tests' seam (gyre_store.faults)
            )  # fmt: skip
            elastic.run(threading.Event())
        elif config.cell != CORE:
            run_satellite(cell, bursts)
        elif live is None:
            publisher = stack.enter_context(EnginePublisher(config.engines)) if config.engines else None
            run_core(cell, bursts, publisher)
        else:
            if log is None:
                raise CellFailedError("a live run's core needs the run's database")
            run_core(cell, bursts, _live_core(stack, config, log, queues, live), record_roles=False)


def _record_transport(log: EventLog, config: CellConfig, name: str, segment: str) -> None:
    """The address this cell's exposed memory is read at, in the run's log (each start)."""
    started = TrainerTransportStarted(
        run_id=config.run_id,
        queue_prefix=config.queue.prefix,
        cell=config.cell,
        transport=name,
        segment=segment,
        node=socket.gethostname(),
    )
    key = f"trainer-transport:{config.queue.prefix}:{config.cell}:{segment}"
    log.append([NewEvent(started, key, metadata=EventMetadata(run_id=config.run_id))])


def _live_core(
    stack: contextlib.ExitStack,
    config: CellConfig,
    log: EventLog,
    queues: Callable[[int], RedisMicroStepQueue],
    live: _Live,
    *,
    consuming: Callable[[], bool] | None = None,
) -> LivePublisher:
    """A live core's packing thread (started here) and its publisher to the run's engines."""
    assert isinstance(log, PostgresEventLog)  # opened by _run from the database URL
    trainer_projections = ProjectionSet([TreeProjection(), *evaluation_projections()])
    store = PostgresProjectionStore(log.pool, trainer_projections.tables())
    stop = threading.Event()
    stack.callback(stop.set)
    feeder = threading.Thread(
        target=_feed_or_die,
        args=(log, store, config.run_id, live.training, queues, live.first_step, stop),
        kwargs={"consuming": consuming},
        name="gyre-stream-packing",
        daemon=True,
    )
    feeder.start()
    return LivePublisher(
        log,
        config.run_id,
        live.publish_dir,
        timeout_s=live.training.publish_timeout_s,
        method=live.training.publish,
    )


def _feed_or_die(*args: Any, **kwargs: Any) -> None:
    """The packing thread of a live core: if it fails, the core cannot go on (it would wait
    for micro-steps forever), so the process ends with the reason on stderr."""
    try:
        feed_batches(*args, **kwargs)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)


class CellCluster:
    """K cell processes, started on enter, joined (or terminated) on exit."""

    def __init__(
        self, configs: Sequence[CellConfig], bursts: Sequence[BurstPlan], *, start_method: str = "forkserver"
    ) -> None:
        self._configs = list(configs)
        self._bursts = tuple(bursts)
        self._context: Any = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._context.set_forkserver_preload(["gyre_train.cells.processes"])
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
