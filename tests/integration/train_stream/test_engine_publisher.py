"""`EnginePublisher` by each method, against the reference engine and (`-m sglang`) real SGLang.

Each publication must make the engine serve the published weights (logprobs equal a forward
pass of the published model) and report the policy version on answers and in `/model_info`.
The SGLang tests need `GYRE_SGLANG_URL` and `GYRE_SGLANG_MODEL_DIR` (and fail without them, see
`tests/real_servers.py`), read at import because the root conftest clears `GYRE_*` variables
before every test, and restore the served weights from the model folder afterwards.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch

from gyre_proxy.engines import EngineClient, EngineClientConfig, GenerateResult, SamplingConfig
from gyre_proxy.engines.refengine import (
    ModelSource,
    ReferenceEngineConfig,
    ReferenceEngineServer,
    load_model,
    save_model_dir,
)
from gyre_train import PublicationError
from gyre_train.backends import TrainingBackend
from gyre_train.cells import EnginePublisher, EnginePublisherConfig
from tests.real_servers import unavailable

pytestmark = pytest.mark.integration

SGLANG_URL = os.environ.get("GYRE_SGLANG_URL")
SGLANG_MODEL_DIR = os.environ.get("GYRE_SGLANG_MODEL_DIR")

PROMPT = [257, 72, 105, 258, 257, 40, 41]
SAMPLING = SamplingConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True)


@dataclass
class ModelBackend:
    """The two things a publisher asks of a training backend, over a Hugging Face model."""

    model: torch.nn.Module

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return {name: tensor.detach() for name, tensor in self.model.state_dict().items()}

    def save(self, path: Path) -> Path:
        return save_model_dir(self.model, path)


@torch.no_grad()
def perturbed(model: torch.nn.Module, seed: int) -> TrainingBackend:
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    for parameter in other.parameters():
        parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return cast(TrainingBackend, ModelBackend(other))


def forward_logprobs(model: torch.nn.Module, output: list[int]) -> np.ndarray:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([PROMPT + output])).logits[0].float()  # [len, vocab]
    logprobs = torch.log_softmax(logits, dim=-1)[len(PROMPT) - 1 : -1]  # [len(output), vocab]
    return logprobs.gather(1, torch.tensor(output)[:, None]).squeeze(1).numpy()


def served(url: str) -> tuple[GenerateResult, str | None]:
    async def ask() -> tuple[GenerateResult, str | None]:
        async with EngineClient(EngineClientConfig(url, timeout_s=60)) as engine:
            result = await engine.generate(PROMPT, SAMPLING)
            return result, (await engine.model_info()).weight_version

    return asyncio.run(ask())


def assert_serves(url: str, backend: TrainingBackend, version: int, atol: float) -> None:
    """`url` serves `backend`'s weights and reports `version` on answers and in /model_info."""
    result, info_version = served(url)
    assert result.weight_version == str(version) == info_version
    model = cast(ModelBackend, backend).model
    expected = forward_logprobs(model, result.output_ids.tolist())
    np.testing.assert_allclose(result.logprobs, expected, atol=atol, rtol=0)


def publish_twice(url: str, config: EnginePublisherConfig, model: torch.nn.Module, atol: float) -> None:
    """Two versions through one publisher (the distributed group is reused), each served."""
    before, _ = served(url)
    with EnginePublisher(config) as publisher:
        for version, seed in ((1, 31), (2, 32)):
            backend = perturbed(model, seed)
            publisher.publish(backend, version)
            assert_serves(url, backend, version, atol)
    after, _ = served(url)
    assert not np.allclose(after.logprobs, before.logprobs, atol=1e-3)


@pytest.fixture
def reference() -> Iterator[ReferenceEngineServer]:
    with ReferenceEngineServer(ReferenceEngineConfig(source=ModelSource(seed=0))) as server:
        yield server


@pytest.mark.parametrize("method", ["disk", "tensor", "distributed"])
def test_publishes_to_the_reference_engine(
    reference: ReferenceEngineServer, method: str, tmp_path: Path
) -> None:
    config = EnginePublisherConfig((reference.base_url,), method, tmp_path, timeout_s=30)
    publish_twice(reference.base_url, config, reference.engine.loaded.model, atol=1e-4)


def test_distributed_reaches_two_engines_with_one_broadcast(tmp_path: Path) -> None:
    config = ReferenceEngineConfig(source=ModelSource(seed=0))
    with ReferenceEngineServer(config) as first, ReferenceEngineServer(config) as second:
        urls = (first.base_url, second.base_url)
        backend = perturbed(first.engine.loaded.model, 33)
        with EnginePublisher(EnginePublisherConfig(urls, "distributed", timeout_s=30)) as publisher:
            publisher.publish(backend, 7)
        for url in urls:
            assert_serves(url, backend, 7, atol=1e-4)
        # Closing the publisher left the group on both engines.
        assert not first.engine._groups and not second.engine._groups


def test_a_failed_broadcast_drops_the_group_and_the_next_publication_opens_a_new_one(
    reference: ReferenceEngineServer,
) -> None:
    engine = reference.engine
    model = engine.loaded.model
    config = EnginePublisherConfig((reference.base_url,), "distributed", timeout_s=5)
    with EnginePublisher(config) as publisher:
        publisher.publish(perturbed(model, 34), 1)
        engine.begin_weight_update()  # someone else's session: the engine refuses the next update
        try:
            with pytest.raises(PublicationError, match="already open"):
                publisher.publish(perturbed(model, 35), 2)
        finally:
            engine.end_weight_update()
        assert not engine._groups  # the broken group was left on the engine too
        backend = perturbed(model, 36)
        publisher.publish(backend, 3)
        assert len(engine._groups) == 1
    assert_serves(reference.base_url, backend, 3, atol=1e-4)


def test_refuses_an_unknown_method_and_names_an_unreachable_engine(tmp_path: Path) -> None:
    with pytest.raises(PublicationError, match="one of disk, tensor, distributed"):
        EnginePublisher(EnginePublisherConfig(("http://127.0.0.1:1",), "nccl"))
    model = load_model(ModelSource(seed=0)).model
    publisher = EnginePublisher(EnginePublisherConfig(("http://127.0.0.1:1",), "tensor", timeout_s=5))
    with pytest.raises(PublicationError, match=re.escape("http://127.0.0.1:1:")):
        publisher.publish(cast(TrainingBackend, ModelBackend(model)), 1)


# -- real SGLang -------------------------------------------------------------------------------


@pytest.fixture
def sglang() -> Iterator[tuple[str, Path]]:
    """The real server's URL and model folder; its original weights are restored afterwards."""
    if not SGLANG_URL or not SGLANG_MODEL_DIR:
        unavailable(
            "sglang",
            "NO REAL SGLANG SERVER: set GYRE_SGLANG_URL and GYRE_SGLANG_MODEL_DIR "
            "(see tools/sglang_setup.sh and docs/engines.md) to publish to SGLang",
        )
    model_dir = Path(SGLANG_MODEL_DIR)
    try:
        yield SGLANG_URL, model_dir
    finally:

        async def restore() -> None:
            async with EngineClient(EngineClientConfig(SGLANG_URL, timeout_s=60)) as engine:
                await engine.update_weights_from_disk(str(model_dir), weight_version="default")

        asyncio.run(restore())


@pytest.mark.sglang
@pytest.mark.parametrize("method", ["tensor", "distributed"])
def test_publishes_to_real_sglang(sglang: tuple[str, Path], method: str) -> None:
    url, model_dir = sglang
    model = load_model(ModelSource(model_dir=model_dir)).model
    config = EnginePublisherConfig((url,), method, timeout_s=60)
    # SGLang's CPU kernels sum in another order than transformers (see the engine contract).
    publish_twice(url, config, model, atol=2e-3)
