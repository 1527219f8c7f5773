"""Publishing the core's weights to rollout engines after the last update of a burst.

The publisher sends to `WeightSink`s, one per engine (by default `EngineWeightSink`, SGLang's
weight-update API, which gyre's reference engine also speaks), by one of three methods: `disk`
(`save_pretrained` into a folder the engines can read), `tensor` (the named tensors in the
request) or `distributed` (one gloo group, this process rank 0, broadcasting every tensor to all
engines at once). The engine reports the new version on every response. The event that records
a publication is written by the caller (core.py), not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

import torch

from gyre_proxy.engines import EngineError, free_port
from gyre_proxy.engines.weights import (
    BroadcastGroup,
    EngineWeightSink,
    TensorSet,
    WeightUpdateGroup,
    open_weight_update_group,
)
from gyre_train.exceptions import PublicationError


class PublishableModel(Protocol):
    """Weights in the engines' layout: a `TrainingBackend`, or an export of one (Megatron)."""

    def save(self, path: Path) -> Path: ...
    def named_tensors(self) -> dict[str, torch.Tensor]: ...


class WeightPublisher(Protocol):
    """Sends the weights of `model` at `policy_version` to every rollout engine."""

    def publish(self, model: PublishableModel, policy_version: int) -> None: ...


class WeightSink(Protocol):
    """One rollout engine, as the publisher sees it: where weights go, by each method.

    Every call makes the engine serve the weights as `policy_version` (or, for `join_group` and
    `leave_group`, changes its membership of a broadcast group). Raises `EngineError` when the
    engine refuses or cannot be reached.
    """

    @property
    def name(self) -> str:
        """How errors name the engine (its URL)."""
        ...

    async def load_from_disk(self, path: Path, policy_version: int) -> None: ...

    async def load_tensors(self, tensors: Mapping[str, torch.Tensor], policy_version: int) -> None: ...

    async def join_group(self, group: BroadcastGroup, rank_offset: int) -> None:
        """Returns once every rank of the group is in (rank 0 joins meanwhile)."""
        ...

    async def receive_broadcast(
        self, group: BroadcastGroup, tensors: Mapping[str, torch.Tensor], policy_version: int
    ) -> None:
        """Receive tensors like `tensors`, in their order, from the group's rank 0 (meanwhile)."""
        ...

    async def leave_group(self, group: BroadcastGroup) -> None: ...


class PublicationMethod(StrEnum):
    """How the weights reach the engines."""

    DISK = "disk"
    TENSOR = "tensor"
    DISTRIBUTED = "distributed"


@dataclass(frozen=True, slots=True)
class EnginePublisherConfig:
    """Engine base URLs, the method (a `PublicationMethod` value) and what it needs.

    `disk` writes folders under `workdir`, which the engines must read at the same path.
    `tensor` to a real SGLang engine works only on the engine's host. `distributed` listens on
    `master_address:master_port` (a free port when None), which the engines must reach; each
    engine joins with `engine_tp_size` ranks.
    """

    engine_urls: tuple[str, ...]
    method: str = PublicationMethod.DISK
    workdir: Path | None = None
    timeout_s: float = 60.0
    master_address: str = "127.0.0.1"
    master_port: int | None = None
    engine_tp_size: int = 1


@dataclass(frozen=True, slots=True)
class _Group:
    """The open broadcast group: this process's end and what the engines joined."""

    group: BroadcastGroup
    trainer: WeightUpdateGroup


# One engine's part of a publication: its index among the sinks, and the sink.
_Send = Callable[[int, WeightSink], Awaitable[object]]


class EnginePublisher:
    """`WeightPublisher` to the engines of `config` (`sinks`: one per engine, by default an
    `EngineWeightSink` per URL).

    A context manager: `close()` leaves the `distributed` group on the engines; the other
    methods hold nothing between publications.
    """

    def __init__(self, config: EnginePublisherConfig, sinks: Sequence[WeightSink] | None = None) -> None:
        try:
            self._method = PublicationMethod(config.method)
        except ValueError:
            choices = ", ".join(method.value for method in PublicationMethod)
            raise PublicationError(
                f"publication method must be one of {choices}, got {config.method!r}"
            ) from None
        if self._method is PublicationMethod.DISK and config.workdir is None:
            raise PublicationError("publication from disk needs a workdir the engines can read")
        if sinks is None:
            sinks = [EngineWeightSink(url, config.timeout_s) for url in config.engine_urls]
        if not sinks:
            raise PublicationError("publication needs at least one engine URL")
        if config.engine_tp_size < 1:
            raise PublicationError(f"engine_tp_size must be at least 1, got {config.engine_tp_size}")
        self._config = config
        self._sinks = tuple(sinks)
        self._group: _Group | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def publish(self, model: PublishableModel, policy_version: int) -> None:
        """Install `model`'s weights as version `policy_version` on every engine.

        Raises `PublicationError` naming the engine that refused or could not be reached.
        """
        if self._method is PublicationMethod.DISK:
            assert self._config.workdir is not None  # checked in __init__
            path = model.save(self._config.workdir / f"policy-v{policy_version}")
            asyncio.run(self._each_engine(lambda _, sink: sink.load_from_disk(path, policy_version)))
        elif self._method is PublicationMethod.TENSOR:
            tensors = TensorSet(model.named_tensors())  # one payload, shared by every engine
            asyncio.run(self._each_engine(lambda _, sink: sink.load_tensors(tensors, policy_version)))
        else:
            self._broadcast(model.named_tensors(), policy_version)

    def close(self) -> None:
        """Leave the broadcast group, if one is open (best effort on the engines' side)."""
        opened, self._group = self._group, None
        if opened is None:
            return

        async def leave(_: int, sink: WeightSink) -> None:
            with contextlib.suppress(EngineError):
                await sink.leave_group(opened.group)

        try:
            asyncio.run(self._all_engines(leave))
        finally:
            opened.trainer.close()

    # -- per engine ------------------------------------------------------------------------------

    async def _one(self, index: int, send: _Send) -> None:
        sink = self._sinks[index]
        try:
            await send(index, sink)
        except EngineError as exc:
            raise PublicationError(f"{sink.name}: {exc}") from exc

    async def _each_engine(self, send: _Send) -> None:
        """`send` to the engines one after another; the first failure stops the publication."""
        for index in range(len(self._sinks)):
            await self._one(index, send)

    async def _all_engines(self, send: _Send) -> None:
        """`send` to every engine at once (each blocks until the broadcast completes)."""
        await asyncio.gather(*(self._one(index, send) for index in range(len(self._sinks))))

    # -- distributed -----------------------------------------------------------------------------

    def _broadcast(self, tensors: Mapping[str, torch.Tensor], policy_version: int) -> None:
        opened = self._group or self._open_group()

        async def send_all() -> None:
            await asyncio.gather(
                asyncio.to_thread(opened.trainer.send_all, tensors),
                self._all_engines(
                    lambda _, sink: sink.receive_broadcast(opened.group, tensors, policy_version)
                ),
            )

        try:
            asyncio.run(send_all())
        except (PublicationError, RuntimeError) as exc:  # RuntimeError: gloo's own errors
            # A half-finished broadcast leaves the group out of step: start a new one next time.
            self.close()
            raise PublicationError(f"broadcast of version {policy_version} failed: {exc}") from exc

    def _open_group(self) -> _Group:
        c = self._config
        group = BroadcastGroup(
            name=f"gyre-publish-{uuid.uuid4().hex[:12]}",
            master_address=c.master_address,
            master_port=c.master_port or free_port(c.master_address),
            world_size=1 + len(self._sinks) * c.engine_tp_size,
        )

        def join(index: int, sink: WeightSink) -> Awaitable[None]:
            return sink.join_group(group, rank_offset=1 + index * c.engine_tp_size)

        try:
            trainer = asyncio.run(
                open_weight_update_group(
                    self._all_engines(join), master_address=group.master_address,
                    master_port=group.master_port, world_size=group.world_size, group_name=group.name,
                    timeout_s=c.timeout_s,
                )
            )  # fmt: skip
        except RuntimeError as exc:  # torch.distributed's store and gloo errors
            raise PublicationError(f"cannot open the broadcast group {group.name}: {exc}") from exc
        self._group = _Group(group, trainer)
        return self._group
