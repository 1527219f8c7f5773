"""Publishing the core's weights to rollout engines after the last update of a burst.

Through SGLang's weight-update API, which gyre's reference engine also speaks: from disk
(`save_pretrained` into a folder the engine can read) or from tensors (base64 safetensors,
`load_format="gyre_safetensors"`). The engine reports the new version on every response. The
event that records a publication is written by the caller (cells.py), not here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gyre_train.backend_torch import TrainingBackend
from gyre_train.streaming_errors import PublicationError


class WeightPublisher(Protocol):
    """Sends the weights of `backend` at `policy_version` to every rollout engine."""

    def publish(self, backend: TrainingBackend, policy_version: int) -> None: ...


@dataclass(frozen=True, slots=True)
class EnginePublisherConfig:
    """Engine base URLs, `disk` or `tensor`, and where `disk` writes its folders."""

    engine_urls: tuple[str, ...]
    method: str = "disk"
    workdir: Path | None = None
    timeout_s: float = 60.0


class EnginePublisher:
    """`WeightPublisher` over the SGLang HTTP API (gyre_proxy's EngineClient)."""

    def __init__(self, config: EnginePublisherConfig) -> None:
        if config.method not in ("disk", "tensor"):
            raise PublicationError(f"publication method must be disk or tensor, got {config.method!r}")
        if config.method == "disk" and config.workdir is None:
            raise PublicationError("publication from disk needs a workdir the engines can read")
        self._config = config

    def publish(self, backend: TrainingBackend, policy_version: int) -> None:
        version = str(policy_version)
        if self._config.method == "disk":
            assert self._config.workdir is not None  # checked in __init__
            path = backend.save(self._config.workdir / f"policy-v{policy_version}")
            asyncio.run(self._send_all(str(path), None, version))
        else:
            from gyre_proxy.engine_weights import serialize_safetensors

            payload = serialize_safetensors(backend.named_tensors())
            asyncio.run(self._send_all(None, [payload], version))

    async def _send_all(self, model_path: str | None, payload: Sequence[str] | None, version: str) -> None:
        from gyre_proxy.engine_client import EngineClient, EngineClientConfig
        from gyre_proxy.engine_weights import GYRE_SAFETENSORS_FORMAT
        from gyre_proxy.exceptions import GyreProxyError

        for url in self._config.engine_urls:
            config = EngineClientConfig(base_url=url, timeout_s=self._config.timeout_s)
            try:
                async with EngineClient(config) as client:
                    if model_path is not None:
                        await client.update_weights_from_disk(model_path, weight_version=version)
                    else:
                        assert payload is not None
                        await client.update_weights_from_tensor(
                            payload, weight_version=version, load_format=GYRE_SAFETENSORS_FORMAT
                        )
            except GyreProxyError as exc:
                raise PublicationError(f"{url}: {exc}") from exc
