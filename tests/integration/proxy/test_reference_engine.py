"""Reference-engine features beyond the shared contract, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from gyre_proxy.engines import (
    EngineClient,
    EngineClientConfig,
    EngineUnavailable,
    FinishKind,
    SamplingConfig,
    WeightUpdateFailed,
)
from gyre_proxy.engines.refengine import (
    ByteTokenizer,
    ReferenceEngineConfig,
    ReferenceEngineServer,
    free_port,
)
from gyre_proxy.engines.weights import (
    GYRE_SAFETENSORS_FORMAT,
    dtype_name,
    open_weight_update_group,
    serialize_for_sglang,
    serialize_safetensors,
)
from gyre_proxy.engines.wire import (
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightsFromTensorRequest,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOOL_CALL = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceEngineServer]:
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps({"rule": "match", "outputs": [{"text": TOOL_CALL, "when": "list files"}]}))
    with ReferenceEngineServer(ReferenceEngineConfig(max_context=512, script=script)) as running:
        yield running


def client(server: ReferenceEngineServer) -> EngineClient:
    return EngineClient(EngineClientConfig(server.base_url, timeout_s=60))


def forward_logprobs(model: torch.nn.Module, prompt: list[int], output: list[int]) -> np.ndarray:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return logprobs.gather(1, torch.tensor(output)[:, None]).squeeze(1).numpy()


async def test_scripted_policy_forces_the_tool_call_with_true_logprobs(server: ReferenceEngineServer) -> None:
    tokenizer = ByteTokenizer()
    prompt = tokenizer.encode("<|im_start|>user\nplease list files<|im_end|>\n<|im_start|>assistant\n")
    async with client(server) as engine:
        scripted = await engine.generate(prompt, SamplingConfig(max_new_tokens=200))
        free = await engine.generate(tokenizer.encode("something else"), SamplingConfig(max_new_tokens=5))
    assert tokenizer.decode(scripted.output_ids.tolist()) == TOOL_CALL
    assert scripted.finish.kind is FinishKind.STOP and scripted.finish.matched == tokenizer.eos_token_id
    expected = forward_logprobs(server.engine.loaded.model, prompt, scripted.output_ids.tolist())
    np.testing.assert_allclose(scripted.logprobs, expected, atol=1e-4)
    assert tokenizer.decode(free.output_ids.tolist()) != TOOL_CALL[:5]


async def test_concurrent_requests_each_get_their_own_logits_from_the_shared_projection(
    server: ReferenceEngineServer,
) -> None:
    """The output projection runs once per pass for every request in it: each request's reported
    logprobs are still those of a whole-model forward over its own prompt and output."""
    tokenizer = ByteTokenizer()
    prompts = [tokenizer.encode(f"prompt number {i} " * (i + 1)) for i in range(6)]
    async with client(server) as engine:
        answers = await asyncio.gather(
            *(engine.generate(p, SamplingConfig(max_new_tokens=24, temperature=1.0)) for p in prompts)
        )
    for prompt, answer in zip(prompts, answers, strict=True):
        output = answer.output_ids.tolist()
        assert len(output) > 0
        expected = forward_logprobs(server.engine.loaded.model, prompt, output)
        np.testing.assert_allclose(answer.logprobs, expected, atol=1e-4)


async def test_update_weights_from_tensor_needs_a_session_and_safetensors(
    server: ReferenceEngineServer,
) -> None:
    name = "model.norm.weight"
    model = server.engine.loaded.model
    original = model.state_dict()[name].clone()
    prompt = [10, 20, 30]
    sampling = SamplingConfig(max_new_tokens=4, temperature=0.0)
    async with client(server) as engine:
        before = await engine.generate(prompt, sampling)
        payload = serialize_safetensors({name: original * 3})
        try:
            with pytest.raises(WeightUpdateFailed, match="session"):
                await engine._weight_call(
                    "/update_weights_from_tensor",
                    _tensor_body([payload], GYRE_SAFETENSORS_FORMAT),
                )
            with pytest.raises(WeightUpdateFailed, match="load_format"):
                await engine.update_weights_from_tensor(
                    [serialize_for_sglang([(name, original)])], weight_version="never"
                )
            await engine.update_weights_from_tensor(
                [payload], weight_version="t1", load_format=GYRE_SAFETENSORS_FORMAT
            )
            after = await engine.generate(prompt, sampling)
            assert torch.equal(model.state_dict()[name], original * 3)
        finally:
            restore = serialize_safetensors({name: original})
            await engine.update_weights_from_tensor(
                [restore], weight_version="default", load_format=GYRE_SAFETENSORS_FORMAT
            )
    assert after.weight_version == "t1"
    assert not np.allclose(after.logprobs, before.logprobs)


def _tensor_body(serialized: list[str], load_format: str) -> UpdateWeightsFromTensorRequest:
    return UpdateWeightsFromTensorRequest(serialized_named_tensors=serialized, load_format=load_format)


async def test_update_weights_from_distributed_over_gloo(server: ReferenceEngineServer) -> None:
    model = server.engine.loaded.model
    names = ["model.norm.weight", "lm_head.weight"]
    originals = {name: model.state_dict()[name].clone() for name in names}
    new = {name: torch.full_like(tensor, 0.01) for name, tensor in originals.items()}
    port = free_port()
    async with client(server) as engine:
        init = InitWeightsUpdateGroupRequest(
            master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2, group_name="g-test"
        )
        trainer = await open_weight_update_group(
            engine.init_weights_update_group(init), master_address="127.0.0.1", master_port=port,
            world_size=2, group_name="g-test",
        )  # fmt: skip
        with trainer:

            async def publish(tensors: dict[str, torch.Tensor], version: str) -> None:
                body = UpdateWeightsFromDistributedRequest(
                    names=names,
                    dtypes=[dtype_name(tensors[name].dtype) for name in names],
                    shapes=[list(tensors[name].shape) for name in names],
                    group_name="g-test",
                    weight_version=version,
                )

                def send() -> None:
                    for name in names:
                        trainer.broadcast(tensors[name])

                await asyncio.gather(asyncio.to_thread(send), engine.update_weights_from_distributed(body))

            await publish(new, "d1")
            loaded = {name: model.state_dict()[name].clone() for name in names}
            version = (await engine.model_info()).weight_version
            await publish(originals, "default")
    assert version == "d1"
    for name in names:
        assert torch.equal(loaded[name], new[name])
        assert torch.equal(model.state_dict()[name], originals[name])


async def test_released_memory_refuses_generation_until_resumed(server: ReferenceEngineServer) -> None:
    async with client(server) as engine:
        await engine.release_memory_occupation(["kv_cache", "weights"])
        try:
            with pytest.raises(EngineUnavailable):
                await engine.generate([1, 2], SamplingConfig(max_new_tokens=2))
        finally:
            await engine.resume_memory_occupation()
        result = await engine.generate([1, 2], SamplingConfig(max_new_tokens=2, temperature=0.0))
    assert len(result.output_ids) == 2


def test_serves_a_model_folder_with_its_own_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from gyre_proxy.engines.refengine import ModelSource, load_model, save_model_dir

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(["ls -la", "cat README.md", "print('hello world')"] * 20, trainer=trainer)
    loaded = load_model(ModelSource(seed=3))
    folder = save_model_dir(loaded.model, tmp_path / "model")
    bpe.save(str(folder / "tokenizer.json"))
    config = ReferenceEngineConfig(source=ModelSource(model_dir=folder))
    with ReferenceEngineServer(config) as running:
        tokenizer = running.engine.loaded.tokenizer
        assert tokenizer.decode(tokenizer.encode("cat README.md")) == "cat README.md"

        async def call() -> list[int]:
            async with client(running) as engine:
                result = await engine.generate(tokenizer.encode("ls"), SamplingConfig(max_new_tokens=3))
            return result.output_ids.tolist()

        assert len(asyncio.run(call())) >= 1
    assert running.engine.loaded.model_path == str(folder)
