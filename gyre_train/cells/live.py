"""Trainer cells of a live run: batches fed from the trajectory database, published to the
run's engines, resumable from the log.

The core's process also runs the stream packing buffer (``feed_batches``, a thread): for each
step it records ``batch.started`` once the previous step's update is recorded, then packs the
step's B groups from the trajectory database into micro-steps as they become ready
(``stream_batch`` over a ``StoreGroupSource``, whose ``take`` records the group's consumption
and ``batch.group_claimed``). The cells train the batch as streaming training does everywhere
(``run_core``, ``run_satellite``); every ``mu`` steps the core publishes through a
``LivePublisher``: the policy saved once to a folder (what a resumed core and a restarted
engine load), then sent to every engine the run has registered at once, by the run's method
(``disk``: each engine loads the folder; ``tensor``: the tensors in the request; ``distributed``:
one gloo broadcast to all), each engine's generation paused meanwhile where it can pause. An
engine that cannot be reached is skipped (a restarted engine loads the newest published policy
itself); one that refuses fails the publication. What each publication took (seconds, engines
reached and skipped, requests paused) goes into the core's ``policy.published`` event
(``publication_event``), so the run's report reads it from the log (also appended, for now, to
``publications.jsonl`` beside the policies).

A trainer started again on a run that already trained resumes after the last publication: it
loads that policy, trains again the steps whose updates were lost (their recorded facts stand;
the groups those steps had consumed are taken again), and goes on. Each publication also
keeps the core's optimizer state beside the policy (``policy-v<N>.optimizer.pt``, the newest
only), so a resumed core goes on with its moments; a Megatron core publishes an export and
keeps none (its moments start again from zero).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from gyre_proxy.engines import EngineError, EngineUnavailable
from gyre_proxy.engines.weights import EngineWeightSink, TensorSet
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
from gyre_train.cells.publish import (
    EnginePublisher,
    EnginePublisherConfig,
    PublicationMethod,
    PublishableModel,
    WeightSink,
)
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
    publish: str = PublicationMethod.DISK  # how the weights reach the engines (PublicationMethod)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.mu < 1:
            raise InvalidConfigError(f"steps ({self.steps}) and mu ({self.mu}) must be at least 1")
        if self.publish not in {m.value for m in PublicationMethod}:
            choices = ", ".join(m.value for m in PublicationMethod)
            raise InvalidConfigError(f"publish must be one of {choices}, got {self.publish!r}")


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


PUBLICATIONS_FILE = "publications.jsonl"


@runtime_checkable
class PausesGeneration(Protocol):
    """A sink whose engine can pause generation for an update (``EngineWeightSink``)."""

    async def pause(self) -> int | None: ...
    async def resume(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Publication:
    """What one publication took: the save, the send to all engines at once (with the pause
    before and the continue after), each engine's seconds (``engines``), the engines skipped
    because they could not be reached, and the requests each engine that paused had in flight."""

    version: int
    method: str
    started_at: float  # time.time() when the publication began
    save_s: float
    send_s: float
    engines: dict[str, float]
    skipped: list[str]
    paused: dict[str, int] = field(default_factory=dict)
    note: str = ""


class LivePublisher:
    """``WeightPublisher`` to every engine ``run_id`` has registered (its latest registration),
    all at once, by ``method``; ``sink_for(url)`` makes each engine's sink (an
    ``EngineWeightSink`` by default, kept per URL).

    Every engine whose sink can pause (``PausesGeneration``) is paused before the weights are
    sent and continued after, whatever the send did: its requests in flight stop between two
    steps and go on under the new weights, instead of the update waiting for them to finish.

    An engine that cannot be reached (``EngineUnavailable``: refused, or slow to accept while
    it is busy) is tried ``unreachable_tries`` times in all, ``retry_pause_s`` apart, then
    skipped and named in the publication's ``skipped``: a dead engine loads the newest policy
    when it starts again, and a live one gets the next publication.
    """

    def __init__(
        self,
        log: EventLog,
        run_id: str,
        publish_dir: Path,
        *,
        timeout_s: float = 120.0,
        method: str = PublicationMethod.DISK,
        sink_for: Callable[[str], WeightSink] | None = None,
        pause: bool = True,
        unreachable_tries: int = 3,
        retry_pause_s: float = 1.0,
    ) -> None:
        if unreachable_tries < 1:
            raise InvalidConfigError(f"unreachable_tries must be at least 1, got {unreachable_tries}")
        self.unreachable_tries = unreachable_tries
        self.retry_pause_s = retry_pause_s
        self.log = log
        self.run_id = run_id
        self.publish_dir = publish_dir
        self.timeout_s = timeout_s
        self.method = PublicationMethod(method)
        self.pause = pause
        self._sink_for = sink_for or self._engine_sink
        self._engine_sinks: dict[str, EngineWeightSink] = {}
        self.skipped: list[tuple[int, str]] = []  # (version, engine) that could not be reached
        self.publications: list[Publication] = []
        # distributed: one broadcast group while the set of engines stays the same
        self._group: tuple[tuple[str, ...], EnginePublisher] | None = None

    def engines(self) -> dict[str, str]:
        """Engine name -> URL, as each engine of the run last registered."""
        found: dict[str, str] = {}
        for recorded in self.log.read(0, types=["engine.registered"], limit=1_000_000):
            event = recorded.event
            if isinstance(event, EngineRegistered) and event.run_id == self.run_id:
                found[event.engine] = event.url
        return found

    def _engine_sink(self, url: str) -> EngineWeightSink:
        """The engine at ``url`` over HTTP, kept: it remembers how the engine takes tensors and
        how it pauses."""
        if url not in self._engine_sinks:
            self._engine_sinks[url] = EngineWeightSink(url, self.timeout_s)
        return self._engine_sinks[url]

    def publish(self, model: PublishableModel, policy_version: int) -> None:
        started_at, began = time.time(), time.perf_counter()
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
        saved = time.perf_counter()
        note = ""
        seconds: dict[str, float] = {}
        paused = self._pause_all(engines) if self.pause else {}
        try:
            if self.method is PublicationMethod.DISTRIBUTED:
                note = self._broadcast(model, policy_version, engines, seconds)
                if note:  # the folder is saved: every engine loads it instead
                    seconds.clear()
                    self._to_all(engines, lambda sink: sink.load_from_disk(path, policy_version), seconds)
            elif self.method is PublicationMethod.TENSOR:
                tensors = TensorSet(model.named_tensors())  # one payload, shared by every engine
                self._to_all(engines, lambda sink: sink.load_tensors(tensors, policy_version), seconds)
            else:
                self._to_all(engines, lambda sink: sink.load_from_disk(path, policy_version), seconds)
        finally:  # an engine left paused would hold its requests for good
            self._continue_all({name: engines[name] for name in paused})
        done = time.perf_counter()
        skipped = sorted(set(engines) - set(seconds))
        self.skipped.extend((policy_version, name) for name in skipped)
        publication = Publication(
            version=policy_version,
            method=self.method.value,
            started_at=started_at,
            save_s=saved - began,
            send_s=done - saved,
            engines=seconds,
            skipped=skipped,
            paused=paused,
            note=note,
        )
        self.publications.append(publication)
        # Read by tools/run.py until its report reads policy.published (publications_from_log).
        with (self.publish_dir / PUBLICATIONS_FILE).open("a") as out:
            out.write(json.dumps(asdict(publication)) + "\n")

    def publication_event(self, policy_version: int, step: int) -> WeightsPublished:
        """The event recording publication ``policy_version`` (the update of ``step``), with
        what this publisher measured of it (none when it did not publish that version)."""
        measured = next((p for p in reversed(self.publications) if p.version == policy_version), None)
        if measured is None:
            return WeightsPublished(run_id=self.run_id, policy_version=policy_version, step=step)
        return WeightsPublished(
            run_id=self.run_id,
            policy_version=policy_version,
            step=step,
            method=measured.method,
            started_at=measured.started_at,
            save_s=measured.save_s,
            send_s=measured.send_s,
            engines=dict(measured.engines),
            skipped=tuple(measured.skipped),
            paused=dict(measured.paused),
            note=measured.note,
        )

    def _pause_all(self, engines: dict[str, str]) -> dict[str, int]:
        """Pause every engine that can, at once; engine -> its requests in flight when asked.
        An engine that cannot pause, or cannot be reached, is left out (its update waits)."""
        pausable = {n: s for n, u in engines.items() if isinstance(s := self._sink_for(u), PausesGeneration)}

        async def each() -> list[int | BaseException | None]:
            return await asyncio.gather(*(s.pause() for s in pausable.values()), return_exceptions=True)

        paused: dict[str, int] = {}
        for name, outcome in zip(pausable, asyncio.run(each()), strict=True):
            if isinstance(outcome, int):
                paused[name] = outcome
            elif isinstance(outcome, BaseException) and not isinstance(outcome, EngineError):
                self._continue_all({n: engines[n] for n in paused})
                raise outcome
        return paused

    def _continue_all(self, engines: dict[str, str]) -> None:
        """Continue every engine paused; one that cannot be reached any more is left (a
        restarted engine starts unpaused)."""

        async def each() -> list[BaseException | None]:
            sinks = [self._sink_for(url) for url in engines.values()]
            return await asyncio.gather(
                *(s.resume() for s in sinks if isinstance(s, PausesGeneration)), return_exceptions=True
            )

        for outcome in asyncio.run(each()):
            if isinstance(outcome, BaseException) and not isinstance(outcome, EngineError):
                raise outcome

    def _to_all(
        self,
        engines: dict[str, str],
        send: Callable[[WeightSink], Awaitable[None]],
        seconds: dict[str, float],
    ) -> None:
        """``send`` to every engine at once; each one reached gets its seconds in ``seconds``.
        Unreachable engines are left out; the first refusal, once all answered, is raised."""

        async def one(name: str, url: str) -> None:
            began = time.perf_counter()
            for attempt in range(1, self.unreachable_tries + 1):
                try:
                    await send(self._sink_for(url))
                    break
                except EngineUnavailable:
                    if attempt == self.unreachable_tries:
                        raise
                    await asyncio.sleep(self.retry_pause_s * attempt)
            seconds[name] = time.perf_counter() - began

        async def each() -> list[BaseException | None]:
            return await asyncio.gather(
                *(one(name, url) for name, url in sorted(engines.items())), return_exceptions=True
            )

        for (name, url), outcome in zip(sorted(engines.items()), asyncio.run(each()), strict=True):
            if outcome is None or isinstance(outcome, EngineUnavailable):
                continue  # an unreachable engine loads the newest policy when it starts again
            if isinstance(outcome, EngineError):
                raise PublicationError(f"{name} ({url}): {outcome}") from outcome
            raise outcome

    def _broadcast(
        self, model: PublishableModel, policy_version: int, engines: dict[str, str], seconds: dict[str, float]
    ) -> str:
        """One gloo broadcast to every engine (the group kept while the engines stay the same);
        returns why it failed ("" when it did not)."""
        urls = tuple(url for _, url in sorted(engines.items()))
        if self._group is not None and self._group[0] != urls:
            self.close()  # an engine came or went: the next group has the engines of now
        if self._group is None:
            config = EnginePublisherConfig(urls, PublicationMethod.DISTRIBUTED, timeout_s=self.timeout_s)
            self._group = (urls, EnginePublisher(config, [self._sink_for(url) for url in urls]))
        began = time.perf_counter()
        try:
            self._group[1].publish(model, policy_version)
        except PublicationError as exc:
            self.close()
            return f"broadcast failed, every engine loaded the folder instead: {exc}"
        took = time.perf_counter() - began
        seconds.update({name: took for name in engines})
        return ""

    def close(self) -> None:
        """Leave an open broadcast group (``distributed``)."""
        group, self._group = self._group, None
        if group is not None:
            group[1].close()


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
