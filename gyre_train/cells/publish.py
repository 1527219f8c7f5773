"""Publishing the core's weights to rollout engines after the last update of a burst.

Through SGLang's weight-update API, which gyre's reference engine also speaks, by one of three
methods: `disk` (`save_pretrained` into a folder the engines can read), `tensor` (the payload
each engine takes: SGLang's shared-memory pickle from the same host, or base64 safetensors
for the reference engine, chosen from `/model_info`), or `distributed` (one gloo group, this
process rank 0, broadcasting every tensor to all engines at once). The engine reports the
new version on every response. The event that records a publication is written by the caller
(cells.py), not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self

import torch

from gyre_train.exceptions import PublicationError

if TYPE_CHECKING:
    from gyre_proxy.engines.client import EngineClient
    from gyre_proxy.engines.weights import WeightUpdateGroup

# One engine's part of a publication, given a client for it.
_Send = Callable[["EngineClient"], Awaitable[object]]


class PublishableModel(Protocol):
    """Weights in the engines' layout: a `TrainingBackend`, or an export of one (Megatron)."""

    def save(self, path: Path) -> Path: ...
    def named_tensors(self) -> dict[str, torch.Tensor]: ...


class WeightPublisher(Protocol):
    """Sends the weights of `model` at `policy_version` to every rollout engine."""

    def publish(self, model: PublishableModel, policy_version: int) -> None: ...


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
    """The open broadcast group: this process's end and its name on the engines."""

    name: str
    trainer: WeightUpdateGroup


class EnginePublisher:
    """`WeightPublisher` over the SGLang HTTP API (gyre_proxy's EngineClient).

    A context manager: `close()` leaves the `distributed` group on the engines; the other
    methods hold nothing between publications.
    """

    def __init__(self, config: EnginePublisherConfig) -> None:
        try:
            self._method = PublicationMethod(config.method)
        except ValueError:
            choices = ", ".join(method.value for method in PublicationMethod)
            raise PublicationError(
                f"publication method must be one of {choices}, got {config.method!r}"
            ) from None
        if self._method is PublicationMethod.DISK and config.workdir is None:
            raise PublicationError("publication from disk needs a workdir the engines can read")
        if not config.engine_urls:
            raise PublicationError("publication needs at least one engine URL")
        if config.engine_tp_size < 1:
            raise PublicationError(f"engine_tp_size must be at least 1, got {config.engine_tp_size}")
        self._config = config
        self._tensor_formats: dict[str, str | None] = {}
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
        version = str(policy_version)
        if self._method is PublicationMethod.DISK:
            assert self._config.workdir is not None  # checked in __init__
            path = model.save(self._config.workdir / f"policy-v{policy_version}")
            asyncio.run(
                self._each_engine(
                    lambda client: client.update_weights_from_disk(str(path), weight_version=version)
                )
            )
        elif self._method is PublicationMethod.TENSOR:
            tensors = model.named_tensors()
            asyncio.run(self._each_engine(lambda client: self._send_tensors(client, tensors, version)))
        else:
            self._broadcast(model.named_tensors(), version)

    def close(self) -> None:
        """Leave the broadcast group, if one is open (best effort on the engines' side)."""
        group, self._group = self._group, None
        if group is None:
            return
        from gyre_proxy.exceptions import GyreProxyError

        async def leave(client: EngineClient) -> None:
            with contextlib.suppress(GyreProxyError):
                await client.destroy_weights_update_group(group.name)

        try:
            asyncio.run(self._all_engines(leave))
        finally:
            group.trainer.close()

    # -- per engine ------------------------------------------------------------------------------

    def _client(self, url: str) -> EngineClient:
        from gyre_proxy.engines.client import EngineClient, EngineClientConfig

        return EngineClient(EngineClientConfig(base_url=url, timeout_s=self._config.timeout_s))

    async def _each_engine(self, send: _Send) -> None:
        """`send` to the engines one after another; the first failure stops the publication."""
        from gyre_proxy.exceptions import GyreProxyError

        for url in self._config.engine_urls:
            try:
                async with self._client(url) as client:
                    await send(client)
            except GyreProxyError as exc:
                raise PublicationError(f"{url}: {exc}") from exc

    async def _all_engines(self, send: _Send) -> None:
        """`send` to every engine at once (each blocks until the broadcast completes)."""
        from gyre_proxy.exceptions import GyreProxyError

        async def one(url: str) -> None:
            try:
                async with self._client(url) as client:
                    await send(client)
            except GyreProxyError as exc:
                raise PublicationError(f"{url}: {exc}") from exc

        await asyncio.gather(*(one(url) for url in self._config.engine_urls))

    async def _send_tensors(
        self, client: EngineClient, tensors: Mapping[str, torch.Tensor], version: str
    ) -> None:
        from gyre_proxy.engines.weights import (
            GYRE_SAFETENSORS_FORMAT,
            serialize_safetensors,
            sglang_tensor_payload,
        )

        url = client.config.base_url
        if url not in self._tensor_formats:
            formats = await client.tensor_load_formats()
            if formats is None:
                self._tensor_formats[url] = None  # real SGLang: its own pickle, same host
            elif GYRE_SAFETENSORS_FORMAT in formats:
                self._tensor_formats[url] = GYRE_SAFETENSORS_FORMAT
            else:
                raise PublicationError(f"{url} takes tensor payloads as {formats}, none of which gyre writes")
        load_format = self._tensor_formats[url]
        if load_format is None:
            # Held until the engine answered: it reads the tensors from shared memory meanwhile.
            with sglang_tensor_payload(tensors) as payload:
                await client.update_weights_from_tensor([payload], weight_version=version)
        else:
            payload = serialize_safetensors(tensors)
            await client.update_weights_from_tensor(
                [payload], weight_version=version, load_format=load_format
            )

    # -- distributed -----------------------------------------------------------------------------

    def _broadcast(self, tensors: Mapping[str, torch.Tensor], version: str) -> None:
        from gyre_proxy.engines.weights import distributed_request

        group = self._group or self._open_group()
        body = distributed_request(tensors, group_name=group.name, weight_version=version)

        async def send_all() -> None:
            await asyncio.gather(
                asyncio.to_thread(group.trainer.send_all, tensors),
                self._all_engines(lambda client: client.update_weights_from_distributed(body)),
            )

        try:
            asyncio.run(send_all())
        except (PublicationError, RuntimeError) as exc:  # RuntimeError: gloo's own errors
            # A half-finished broadcast leaves the group out of step: start a new one next time.
            self.close()
            raise PublicationError(f"broadcast of version {version} failed: {exc}") from exc

    def _open_group(self) -> _Group:
        from gyre_proxy.engines.refengine import free_port
        from gyre_proxy.engines.weights import open_weight_update_group
        from gyre_proxy.engines.wire import InitWeightsUpdateGroupRequest

        c = self._config
        name = f"gyre-publish-{uuid.uuid4().hex[:12]}"
        port = c.master_port or free_port(c.master_address)
        world_size = 1 + len(c.engine_urls) * c.engine_tp_size
        ranks = {url: 1 + index * c.engine_tp_size for index, url in enumerate(c.engine_urls)}

        def join(client: EngineClient) -> Awaitable[None]:
            body = InitWeightsUpdateGroupRequest(
                master_address=c.master_address,
                master_port=port,
                rank_offset=ranks[client.config.base_url],
                world_size=world_size,
                group_name=name,
                backend="gloo",
            )
            return client.init_weights_update_group(body)

        try:
            trainer = asyncio.run(
                open_weight_update_group(
                    self._all_engines(join), master_address=c.master_address, master_port=port,
                    world_size=world_size, group_name=name, timeout_s=c.timeout_s,
                )
            )  # fmt: skip
        except RuntimeError as exc:  # torch.distributed's store and gloo errors
            raise PublicationError(f"cannot open the broadcast group {name}: {exc}") from exc
        self._group = _Group(name, trainer)
        return self._group
