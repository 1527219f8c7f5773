"""The engine contract: what gyre needs from any engine, checked over real HTTP.

Runs against gyre's reference engine always and against a real SGLang server when one is
configured (``-m sglang``). Logprobs are checked against a direct forward pass of the same
weights, so a wrong position, distribution or dtype shows up as a mismatch.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from gyre_proxy import (
    ContextLengthExceeded,
    EngineClient,
    EngineClientConfig,
    EngineNotAccepting,
    FinishKind,
    GenerateResult,
    SamplingConfig,
)
from gyre_proxy.refengine import save_model_dir

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
    if not target.gyre_admin:
        pytest.skip(f"{target.name} has no /gyre admission endpoints")
    prompt = prompt_of(4)
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
