"""Trainer cells of a live run: batches fed from the trajectory database, published to the
run's engines, resumable from the log.

The core's process also runs the stream packing buffer (``feed_batches``, a thread): for each
step it records ``batch.started`` once the previous step's update is recorded, then packs the
step's B groups from the trajectory database into micro-steps as they become ready
(``stream_batch`` over a ``StoreGroupSource``, whose ``take`` records the group's consumption
and ``batch.group_claimed``). The cells train the batch as streaming training does everywhere
(``run_core``, ``run_satellite``); every ``mu`` steps the core publishes through a
``LivePublisher``: the policy saved once to a folder the engines read, loaded by every engine
the run has registered. An engine that cannot be reached is skipped (a restarted engine loads
the newest published policy itself); one that refuses fails the publication.

A trainer started again on a run that already trained resumes after the last publication: it
loads that policy, trains again the steps whose updates were lost (their recorded facts stand;
the groups those steps had consumed are taken again), and goes on. Each publication also
keeps the core's optimizer state beside the policy (``policy-v<N>.optimizer.pt``, the newest
only), so a resumed core goes on with its moments; a Megatron core publishes an export and
keeps none (its moments start again from zero).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from gyre_proxy.engines import EngineError, EngineUnavailable
from gyre_proxy.engines.weights import EngineWeightSink
from gyre_store import (
    BatchClosed,
    BatchStarted,
    EngineRegistered,
    EventLog,
    EventMetadata,
    NewEvent,
    ProjectionStore,
    RunStarted,
    StreamId,
    WeightsPublished,
)
from gyre_train.cells.cell import BurstPlan
from gyre_train.cells.claims import MicroStepQueue
from gyre_train.cells.producer import ProducerConfig, stream_batch
from gyre_train.cells.publish import PublishableModel
from gyre_train.exceptions import CellFailedError, InvalidConfigError, PublicationError
from gyre_train.trajectories import (
    GroupSourceConfig,
    GroupTicket,
    PackingConfig,
    ReadyGroup,
    StoreGroupSource,
)


@dataclass(frozen=True, slots=True)
class LiveTraining:
    """How many steps a live run trains, its burst length, and how batches are packed."""

    steps: int
    mu: int
    packing: PackingConfig
    groups: GroupSourceConfig = field(default_factory=GroupSourceConfig)
    producer_timeout_s: float = 3600.0
    publish_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.mu < 1:
            raise InvalidConfigError(f"steps ({self.steps}) and mu ({self.mu}) must be at least 1")


def bursts_from(first_step: int, steps: int, mu: int, satellites: int) -> tuple[BurstPlan, ...]:
    """The bursts of steps ``first_step`` .. ``steps - 1`` (``first_step`` starts a burst); every
    satellite takes part in every batch from its first claim (a fixed partition)."""
    joins = {s: (0, 0) for s in range(1, satellites + 1)}
    return tuple(
        BurstPlan(tuple(range(start, min(start + mu, steps))), joins=joins)
        for start in range(first_step, steps, mu)
    )


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a trainer starts: the step, the policy version, and the folder holding it."""

    step: int
    version: int
    model_dir: Path | None
    training_state: Path | None = None  # the core's optimizer state at that publication


def resume_point(log: EventLog, run_id: str, mu: int, publish_dir: Path) -> Resume:
    """After the run's last publication whose policy folder exists, or from the start."""
    published = [
        r.event.policy_version
        for r in log.read_stream(StreamId("policy", run_id))
        if isinstance(r.event, WeightsPublished)
    ]
    for version in sorted(published, reverse=True):
        folder = policy_dir(publish_dir, version)
        if (folder / "config.json").is_file() and version % mu == 0:
            state = training_state_path(publish_dir, version)
            return Resume(
                step=version,
                version=version,
                model_dir=folder,
                training_state=state if state.is_file() else None,
            )
    return Resume(step=0, version=0, model_dir=None)


def policy_dir(publish_dir: Path, version: int) -> Path:
    return publish_dir / f"policy-v{version}"


def training_state_path(publish_dir: Path, version: int) -> Path:
    """Where the core's optimizer state at publication ``version`` is kept (beside the policy
    folder, never in it: engines load every weight file of that folder)."""
    return publish_dir / f"policy-v{version}.optimizer.pt"


@runtime_checkable
class KeepsTrainingState(Protocol):
    """A published model that can keep its training state for a resumed core (TorchBackend)."""

    def save_training_state(self, path: Path) -> Path | None: ...


class LivePublisher:
    """``WeightPublisher`` to every engine ``run_id`` has registered (its latest registration)."""

    def __init__(self, log: EventLog, run_id: str, publish_dir: Path, *, timeout_s: float = 120.0) -> None:
        self.log = log
        self.run_id = run_id
        self.publish_dir = publish_dir
        self.timeout_s = timeout_s
        self.skipped: list[tuple[int, str]] = []  # (version, engine) that could not be reached

    def engines(self) -> dict[str, str]:
        """Engine name -> URL, as each engine of the run last registered."""
        found: dict[str, str] = {}
        for recorded in self.log.read(0, types=["engine.registered"], limit=1_000_000):
            event = recorded.event
            if isinstance(event, EngineRegistered) and event.run_id == self.run_id:
                found[event.engine] = event.url
        return found

    def publish(self, model: PublishableModel, policy_version: int) -> None:
        path = model.save(policy_dir(self.publish_dir, policy_version))
        kept = training_state_path(self.publish_dir, policy_version)
        # Kept before the engines load the policy, so a recorded publication has its state; only
        # the newest is kept (an AdamW state is twice the model).
        if isinstance(model, KeepsTrainingState) and model.save_training_state(kept) is not None:
            for older in self.publish_dir.glob("policy-v*.optimizer.pt"):
                if older != kept:
                    older.unlink(missing_ok=True)
        engines = self.engines()
        if not engines:
            raise PublicationError(f"run {self.run_id} has no registered engine to publish to")

        async def each() -> None:
            for name, url in sorted(engines.items()):
                sink = EngineWeightSink(url, self.timeout_s)
                try:
                    await sink.load_from_disk(path, policy_version)
                except EngineUnavailable:
                    self.skipped.append((policy_version, name))  # it loads the newest policy on restart
                except EngineError as exc:
                    raise PublicationError(f"{name} ({url}): {exc}") from exc

        asyncio.run(each())


class _Resuming:
    """The run's trajectory buffer for one step, taking first the groups the step had consumed
    before a restart (its packer must see them again), then ready groups as usual."""

    def __init__(self, source: StoreGroupSource, retake: Sequence[str]) -> None:
        self._source = source
        self._retake = list(retake)

    def ready_groups(self) -> Sequence[GroupTicket]:
        if self._retake:
            group = self._source.build(self._retake[0])
            return (GroupTicket(group.group_id, -1, -1),)  # before any fresh group
        return self._source.ready_groups()

    def take(self, group_id: str) -> ReadyGroup:
        if self._retake and group_id == self._retake[0]:
            self._retake.pop(0)
            return self._source.retake(group_id)
        return self._source.take(group_id)


def feed_batches(
    log: EventLog,
    store: ProjectionStore,
    run_id: str,
    training: LiveTraining,
    queue_of: Callable[[int], MicroStepQueue],
    first_step: int,
    stop: threading.Event,
    *,
    poll_s: float = 0.1,
    consuming: Callable[[], bool] | None = None,
) -> None:
    """The stream packing buffer of a live run, from ``first_step`` to the last step; with
    ``consuming`` it packs a group only while a cell trains and has claimed what was put
    (``ProducerConfig.consuming``: the elastic cells' supply check counts unclaimed groups).

    Raises ProducerTimeoutError when a batch waits longer than ``producer_timeout_s`` for its
    next ready group, CellFailedError when stopped."""
    source = StoreGroupSource(log, store, training.groups, step=first_step)
    meta = EventMetadata(run_id=run_id)
    producer = ProducerConfig(
        training.packing,
        poll_s=poll_s,
        timeout_s=training.producer_timeout_s,
        consuming=consuming,
    )
    # The decision core takes no fact of a run before it started (the run may evaluate first).
    while not any(isinstance(r.event, RunStarted) for r in log.read_stream(StreamId("run", run_id))):
        if stop.is_set():
            raise CellFailedError("stopped before the run started")
        time.sleep(poll_s)
    for step in range(first_step, training.steps):
        # The decision core counts one open batch at a time: step opens after step - 1 closed.
        while step > first_step and not _closed(log, run_id, step - 1):
            if stop.is_set():
                raise CellFailedError(f"stopped before batch {step} opened")
            time.sleep(poll_s)
        started = BatchStarted(run_id=run_id, step=step)
        log.append([NewEvent(started, f"batch.started:{run_id}/{step}", metadata=meta)])
        source.step = step
        stream_batch(queue_of(step), _Resuming(source, source.consumed_by_step(step)), producer)


def _closed(log: EventLog, run_id: str, step: int) -> bool:
    return any(
        isinstance(r.event, BatchClosed) for r in log.read_stream(StreamId("batch", f"{run_id}/{step}"))
    )
