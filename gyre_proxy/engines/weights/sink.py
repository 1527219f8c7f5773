"""One rollout engine as the destination of published weights, over SGLang's HTTP API.

`EngineWeightSink` drives an `EngineClient` through the three ways weights reach an engine: a
folder the engine reads (`/update_weights_from_disk`); tensors in the request
(`/update_weights_from_tensor`, in the payload the engine takes: SGLang's same-host shared-memory
pickle when `/model_info` lists no formats, else gyre's base64 safetensors); or a gloo broadcast
received after joining a named group (`/init_weights_update_group`, then
`/update_weights_from_distributed`). `pause` and `resume` bracket an update with
`/pause_generation` and `/continue_generation` where the engine has them. Each call opens its own client, so a sink serves any event
loop. Errors are the engine layer's (`EngineError`). It does not choose the method, hold the
trainer's end of a group (`payloads.WeightUpdateGroup`) or know what trains the weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from gyre_proxy.engines import wire as engine_api
from gyre_proxy.engines.client import EngineClient, EngineClientConfig
from gyre_proxy.engines.weights.payloads import (
    GYRE_SAFETENSORS_FORMAT,
    distributed_request,
    safetensors_payload,
    sglang_tensor_payload,
)
from gyre_proxy.exceptions import EngineBadRequest, EngineProtocolError, WeightUpdateFailed


@dataclass(frozen=True, slots=True)
class BroadcastGroup:
    """A named gloo group whose rank 0 (the trainer) broadcasts weights to the engines in it."""

    name: str
    master_address: str
    master_port: int
    world_size: int


# Pause modes tried in order: SGLang's retract (running requests go back to the queue and their
# KV is computed again under the new weights, so the update can flush the cache), then
# in_place (the reference engine: each request keeps its own cache, which no update flushes).
PAUSE_MODES = ("retract", "in_place")


class EngineWeightSink:
    """Weights into the engine at `url`, through SGLang's weight-update API."""

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        self._config = EngineClientConfig(base_url=url, timeout_s=timeout_s)
        self._formats_known = False
        self._load_format: str | None = None  # None: SGLang's own payload
        self._pause_modes: tuple[str, ...] = PAUSE_MODES  # () once the engine cannot pause

    @property
    def name(self) -> str:
        return self._config.base_url

    def _client(self) -> EngineClient:
        return EngineClient(self._config)

    async def pause(self) -> int | None:
        """Pause the engine's generation so that an update need not wait for the requests in
        flight (`/pause_generation`, in the first of `PAUSE_MODES` it takes); they go on after
        `resume`. Returns how many requests it had in flight when asked, or None when it cannot
        pause (no such endpoint, or no mode taken): its updates then wait for them as before.
        Raises `EngineUnavailable` when it cannot be reached."""
        async with self._client() as client:
            for mode in self._pause_modes:
                in_flight = await client.requests_in_flight()
                try:
                    await client.pause_generation(mode)
                except EngineBadRequest:
                    continue  # refuses this mode: try the next
                except EngineProtocolError:
                    break  # no such endpoint
                self._pause_modes = (mode,)
                return in_flight
            self._pause_modes = ()
            return None

    async def resume(self) -> None:
        """Let the requests `pause` stopped go on (`/continue_generation`)."""
        async with self._client() as client:
            await client.continue_generation()

    async def load_from_disk(self, path: Path, policy_version: int) -> None:
        """Serve the weights saved under `path` (a folder on the engine's filesystem)."""
        async with self._client() as client:
            await client.update_weights_from_disk(str(path), weight_version=str(policy_version))

    async def load_tensors(self, tensors: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """Serve `tensors` (named as the engine's model names them), sent in the request.

        Raises `WeightUpdateFailed` when the engine takes no payload format gyre writes.
        """
        version = str(policy_version)
        async with self._client() as client:
            if not self._formats_known:
                formats = await client.tensor_load_formats()
                if formats is not None and GYRE_SAFETENSORS_FORMAT not in formats:
                    raise WeightUpdateFailed(f"takes tensor payloads as {formats}, none of which gyre writes")
                # No formats listed: real SGLang, which takes its own pickle, from the same host.
                self._load_format = None if formats is None else GYRE_SAFETENSORS_FORMAT
                self._formats_known = True
            if self._load_format is None:
                # Held until the engine answered: it reads the tensors from shared memory meanwhile.
                with sglang_tensor_payload(tensors) as payload:
                    await client.update_weights_from_tensor([payload], weight_version=version)
            else:
                await client.update_weights_from_tensor(
                    [safetensors_payload(tensors)], weight_version=version, load_format=self._load_format
                )

    async def join_group(self, group: BroadcastGroup, rank_offset: int) -> None:
        """Join `group` with the engine's ranks from `rank_offset` on; returns once every rank of
        the group is in, so rank 0 must be joining meanwhile."""
        body = engine_api.InitWeightsUpdateGroupRequest(
            master_address=group.master_address,
            master_port=group.master_port,
            rank_offset=rank_offset,
            world_size=group.world_size,
            group_name=group.name,
            backend="gloo",
        )
        async with self._client() as client:
            await client.init_weights_update_group(body)

    async def receive_broadcast(
        self, group: BroadcastGroup, tensors: Mapping[str, torch.Tensor], policy_version: int
    ) -> None:
        """Serve tensors named, typed and shaped as `tensors`, received from `group`'s rank 0,
        which broadcasts them meanwhile in this order."""
        body = distributed_request(tensors, group_name=group.name, weight_version=str(policy_version))
        async with self._client() as client:
            await client.update_weights_from_distributed(body)

    async def leave_group(self, group: BroadcastGroup) -> None:
        """Leave and drop `group` on the engine."""
        async with self._client() as client:
            await client.destroy_weights_update_group(group.name)
