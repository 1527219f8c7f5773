"""The engine contract: what gyre needs from any engine, checked over real HTTP.

Runs against gyre's reference engine always and against a real SGLang server when one is
configured (``-m sglang``). Logprobs are checked against a direct forward pass of the same
weights, so a wrong position, distribution or dtype shows up as a mismatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from gyre_proxy.engines import (
    ContextLengthExceeded,
    EngineClient,
    EngineClientConfig,
    EngineError,
    EngineNotAccepting,
    FinishKind,
    GenerateResult,
    KvCacheNotFound,
    KvMigrationError,
    KvMigrationUnsupported,
    SamplingConfig,
    WeightUpdateFailed,
)
from gyre_proxy.engines.refengine import free_port, save_model_dir
from gyre_proxy.engines.weights import (
    distributed_request,
    open_weight_update_group,
    serialize_for_sglang,
    serialize_safetensors,
    sglang_tensor_payload,
)
from gyre_proxy.engines.wire import InitWeightsUpdateGroupRequest, UpdateWeightsFromTensorRequest

if TYPE_CHECKING:
    from tests.integration.proxy.conftest import EngineTarget

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def client(target: EngineTarget) -> EngineClient:
    return EngineClient(EngineClientConfig(target.base_url, timeout_s=60))


def forward_logprobs(model: torch.nn.Module, prompt: list[int], output: list[int]) -> np.ndarray:
    """log p(output[i] | prompt + output[:i]) from one forward pass: [len(output)]."""
    ids = torch.tensor([prompt + output])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()  # [len, vocab]
    logprobs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]  # [len(output), vocab]
    return logprobs.gather(1, torch.tensor(output)[:, None]).squeeze(1).numpy()


def assert_matches_model(
    target: EngineTarget, prompt: list[int], result: GenerateResult, model: torch.nn.Module | None = None
) -> None:
    """The result's logprobs equal a forward pass of `model` (default: the target's weights)."""
    output = result.output_ids.tolist()
    assert len(output) == len(result.logprobs) > 0
    expected = forward_logprobs(model if model is not None else target.model, prompt, output)
    # Shown with -rP: docs/engines.md quotes the worst difference seen on real SGLang.
    print(f"{target.name}: max |logprob - forward pass| = {np.abs(result.logprobs - expected).max():.2e}")
    np.testing.assert_allclose(result.logprobs, expected, atol=target.logprob_atol, rtol=0)


def prompt_of(seed: int, length: int = 12) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 250, size=length)]


async def test_health_and_model_info(target: EngineTarget) -> None:
    async with client(target) as engine:
        assert await engine.health()
        info = await engine.model_info()
    assert info.model_path
    assert info.weight_version


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_generate_logprobs_match_a_forward_pass(target: EngineTarget, temperature: float) -> None:
    prompt = prompt_of(1)
    sampling = SamplingConfig(max_new_tokens=16, temperature=temperature, seed=7)
    async with client(target) as engine:
        result = await engine.generate(prompt, sampling)
    assert_matches_model(target, prompt, result)
    assert result.weight_version
    assert result.prompt_tokens == len(prompt)
    if result.finish.kind is FinishKind.STOP:
        assert result.output_ids[-1] in target.eos_token_ids
    else:
        assert result.finish.kind is FinishKind.LENGTH
        assert len(result.output_ids) == 16
    if temperature == 0.0:  # greedy: every token is the argmax of the model
        ids = torch.tensor([prompt + result.output_ids.tolist()])
        with torch.inference_mode():
            argmax = target.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1)
        assert argmax.tolist() == result.output_ids.tolist()


async def test_stream_equals_non_stream(target: EngineTarget) -> None:
    prompt = prompt_of(2)
    sampling = SamplingConfig(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    async with client(target) as engine:
        whole = await engine.generate(prompt, sampling)
        deltas = [delta async for delta in engine.generate_stream(prompt, sampling)]
    assert [delta.finish is not None for delta in deltas] == [False] * (len(deltas) - 1) + [True]
    streamed_ids = np.concatenate([delta.output_ids for delta in deltas])
    streamed_logprobs = np.concatenate([delta.logprobs for delta in deltas])
    assert streamed_ids.tolist() == whole.output_ids.tolist()
    np.testing.assert_allclose(streamed_logprobs, whole.logprobs, atol=1e-5)
    assert deltas[-1].finish is not None and deltas[-1].finish.kind is FinishKind.LENGTH
    assert deltas[-1].weight_version == whole.weight_version


async def test_sixteen_concurrent_generates_are_each_correct(target: EngineTarget) -> None:
    prompts = [prompt_of(100 + index, length=4 + index) for index in range(16)]
    sampling = SamplingConfig(max_new_tokens=20, temperature=0.0, ignore_eos=True)
    async with client(target) as engine:
        results = await asyncio.gather(*(engine.generate(prompt, sampling) for prompt in prompts))
    for prompt, result in zip(prompts, results, strict=True):
        assert len(result.output_ids) == 20
        assert_matches_model(target, prompt, result)
    assert len({result.rid for result in results}) == 16


async def test_abort_mid_stream_finishes_with_abort(target: EngineTarget) -> None:
    prompt = prompt_of(3)
    max_new = target.context_length - len(prompt) - 8
    sampling = SamplingConfig(max_new_tokens=max_new, temperature=1.0, ignore_eos=True, seed=1)
    rid = uuid.uuid4().hex
    received = 0
    last = None
    async with client(target) as engine, client(target) as admin:
        async for delta in engine.generate_stream(prompt, sampling, rid=rid):
            received += len(delta.output_ids)
            last = delta
            if received >= 3 and delta.finish is None:
                await admin.abort(rid)
    assert last is not None and last.finish is not None
    assert last.finish.kind is FinishKind.ABORT
    assert 3 <= received < max_new


async def test_context_over_limit_is_a_typed_error(target: EngineTarget) -> None:
    too_long = [5] * (target.context_length + 1)
    async with client(target) as engine:
        with pytest.raises(ContextLengthExceeded):
            await engine.generate(too_long, SamplingConfig(max_new_tokens=4))
        with pytest.raises(ContextLengthExceeded):
            async for _ in engine.generate_stream(too_long, SamplingConfig(max_new_tokens=4)):
                pass
        # A request that fits still works afterwards.
        result = await engine.generate([5, 6, 7], SamplingConfig(max_new_tokens=2, temperature=0.0))
    assert len(result.output_ids) >= 1


async def test_stop_accepting_rejects_new_and_keeps_in_flight(target: EngineTarget) -> None:
    prompt = prompt_of(4)
    if not target.gyre_admin:
        # SGLang has no admission endpoints (the proxy's routing stops sending it new
        # requests): asking is a typed engine error, and the engine goes on serving.
        async with client(target) as engine:
            with pytest.raises(EngineError, match="not found"):
                await engine.stop_accepting()
            served = await engine.generate(prompt, SamplingConfig(max_new_tokens=2, temperature=0.0))
        assert len(served.output_ids) == 2
        return
    sampling = SamplingConfig(max_new_tokens=200, temperature=0.0, ignore_eos=True)
    async with client(target) as engine:
        stream = engine.generate_stream(prompt, sampling)
        first = await anext(stream)
        status = await engine.stop_accepting()
        assert not status.accepting and status.in_flight == 1
        try:
            with pytest.raises(EngineNotAccepting):
                await engine.generate(prompt, SamplingConfig(max_new_tokens=2))
            rest = [delta async for delta in stream]
        finally:
            await engine.resume_accepting()
        assert rest[-1].finish is not None and rest[-1].finish.kind is FinishKind.LENGTH
        assert len(first.output_ids) + sum(len(delta.output_ids) for delta in rest) == 200
        again = await engine.generate(prompt, SamplingConfig(max_new_tokens=2, temperature=0.0))
    assert len(again.output_ids) == 2


@torch.no_grad()
def perturbed_copy(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    for parameter in other.parameters():
        parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return other


async def test_update_weights_from_disk_changes_logprobs_and_version(
    target: EngineTarget, tmp_path: Path
) -> None:
    prompt = prompt_of(5)
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    original_dir = save_model_dir(target.model, tmp_path / "original")
    updated = perturbed_copy(target.model, seed=11)
    updated_dir = save_model_dir(updated, tmp_path / "updated")
    async with client(target) as engine:
        before = await engine.generate(prompt, sampling)
        version_before = (await engine.model_info()).weight_version
        try:
            await engine.update_weights_from_disk(str(updated_dir), weight_version="contract-v2")
            after = await engine.generate(prompt, sampling)
            info = await engine.model_info()
        finally:
            await engine.update_weights_from_disk(
                str(original_dir), weight_version=version_before or "default"
            )
        restored = await engine.generate(prompt, sampling)
    assert after.weight_version == "contract-v2" == info.weight_version
    assert not np.allclose(after.logprobs, before.logprobs, atol=1e-3)
    assert_matches_model(target, prompt, after, updated)
    np.testing.assert_allclose(restored.logprobs, before.logprobs, atol=target.logprob_atol)


Publish = Callable[[EngineClient, dict[str, torch.Tensor], str], Awaitable[None]]


async def check_publication(target: EngineTarget, publish: Publish, *, seed: int, version: str) -> None:
    """`publish` installs perturbed weights (served, versioned), then the originals again."""
    prompt = prompt_of(seed)
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    original = {name: tensor.clone() for name, tensor in target.model.state_dict().items()}
    updated = perturbed_copy(target.model, seed=seed)
    async with client(target) as engine:
        before = await engine.generate(prompt, sampling)
        version_before = (await engine.model_info()).weight_version or "default"
        try:
            await publish(engine, dict(updated.state_dict()), version)
            after = await engine.generate(prompt, sampling)
            info = await engine.model_info()
        finally:
            await publish(engine, original, version_before)
        restored = await engine.generate(prompt, sampling)
        restored_info = await engine.model_info()
    assert after.weight_version == version == info.weight_version
    assert restored.weight_version == version_before == restored_info.weight_version
    assert not np.allclose(after.logprobs, before.logprobs, atol=1e-3)
    assert_matches_model(target, prompt, after, updated)
    assert_matches_model(target, prompt, restored)
    np.testing.assert_allclose(restored.logprobs, before.logprobs, atol=target.logprob_atol)


@contextlib.contextmanager
def tensor_payload(target: EngineTarget, tensors: dict[str, torch.Tensor]) -> Iterator[str]:
    if target.tensor_load_format is None:  # SGLang: shared-memory pickle, same host
        with sglang_tensor_payload(tensors) as payload:
            yield payload
    else:
        yield serialize_safetensors(tensors)


async def test_update_weights_from_tensor_changes_logprobs_and_version(target: EngineTarget) -> None:
    async with client(target) as engine:
        formats = await engine.tensor_load_formats()
    expected = None if target.tensor_load_format is None else (target.tensor_load_format,)
    assert formats == expected

    async def publish(engine: EngineClient, tensors: dict[str, torch.Tensor], version: str) -> None:
        with tensor_payload(target, tensors) as payload:
            await engine.update_weights_from_tensor(
                [payload], weight_version=version, load_format=target.tensor_load_format
            )

    await check_publication(target, publish, seed=21, version="contract-tensor")


async def test_tensor_update_outside_a_session_is_refused(target: EngineTarget) -> None:
    # Both engines refuse before reading the payload, so SGLang's is an empty list: a pickle
    # of tensors it never opens would leave their shared-memory files behind.
    norm = {"model.norm.weight": target.model.state_dict()["model.norm.weight"].clone()}
    payload = serialize_safetensors(norm) if target.tensor_load_format else serialize_for_sglang([])
    body = UpdateWeightsFromTensorRequest(
        serialized_named_tensors=[payload], load_format=target.tensor_load_format
    )
    async with client(target) as engine:
        with pytest.raises(WeightUpdateFailed, match="begin_weight_update"):
            await engine._weight_call("/update_weights_from_tensor", body)
        with pytest.raises(WeightUpdateFailed, match="no weight-update session"):
            await engine.end_weight_update()
        await engine.begin_weight_update()
        try:
            with pytest.raises(WeightUpdateFailed, match="already open"):
                await engine.begin_weight_update()
        finally:
            await engine.end_weight_update()


async def test_update_weights_from_distributed_changes_logprobs_and_version(target: EngineTarget) -> None:
    group_name = f"contract-{uuid.uuid4().hex[:8]}"
    port = free_port()
    init = InitWeightsUpdateGroupRequest(
        master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2, group_name=group_name
    )
    async with client(target) as engine:
        trainer = await open_weight_update_group(
            engine.init_weights_update_group(init), master_address="127.0.0.1", master_port=port,
            world_size=2, group_name=group_name, timeout_s=30,
        )  # fmt: skip
        try:
            with trainer:

                async def publish(
                    engine: EngineClient, tensors: dict[str, torch.Tensor], version: str
                ) -> None:
                    body = distributed_request(tensors, group_name=group_name, weight_version=version)
                    await asyncio.gather(
                        asyncio.to_thread(trainer.send_all, tensors),
                        engine.update_weights_from_distributed(body),
                    )

                await check_publication(target, publish, seed=22, version="contract-distributed")
        finally:
            await engine.destroy_weights_update_group(group_name)
        with pytest.raises(WeightUpdateFailed, match="does not exist"):
            await engine.destroy_weights_update_group(group_name)


async def test_kv_migration_is_a_typed_refusal_the_proxy_can_fall_back_from(target: EngineTarget) -> None:
    # The proxy moves a rerouted request's KV cache where the engine can, and re-prefills where
    # it cannot: either way the engine's answer is a KvMigrationError, never a crash.
    async with client(target) as engine:
        with pytest.raises(KvMigrationError) as refused:
            await engine.pin_and_abort("no-such-request")
        expected = KvCacheNotFound if target.gyre_admin else KvMigrationUnsupported
        assert isinstance(refused.value, expected), refused.value
        served = await engine.generate(prompt_of(3), SamplingConfig(max_new_tokens=2, temperature=0.0))
    assert len(served.output_ids) == 2
