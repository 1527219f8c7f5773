"""The GPU path, checked on a CUDA device: unsharded PyTorch cells training on the GPU, two cells
sharing it over gloo (a satellite's gradients reduced onto the core, the core's update broadcast
back), bfloat16 on the device, and the reference engine decoding on the GPU and serving what a
GPU-trained core publishes.

Magnitudes, not one step's survivors: unclipped SGD with lr 1 moves every weight by its whole
gradient, so the weights after several updates see the scale of every gradient applied. float32
on the GPU and on the CPU differ by summation order only (TF32 is off), hence the tolerances.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from gyre_proxy.engines import EngineClient, EngineClientConfig, GenerateResult, SamplingConfig
from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer, free_port
from gyre_train.backends import ModelSpec, OptimizerConfig, TorchBackend, TorchTraining
from gyre_train.cells import (
    TINY_QWEN3,
    SyntheticBatchConfig,
    gradient_share,
    merge_shares,
    ratio_share,
    synthetic_batch,
)
from gyre_train.cells.membership import ReducePlan
from gyre_train.cells.publish import EnginePublisher, EnginePublisherConfig
from gyre_train.cells.replica import RankLayout, Replica
from gyre_train.objective import LossConfig
from tests.integration.train_stream.gloo import gloo_world

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

SPEC = ModelSpec(TINY_QWEN3, seed=7)
DATA = SyntheticBatchConfig(groups=2, executions=3, max_rows=2, vocab_size=512)
SGD = OptimizerConfig(kind="sgd", lr=1.0, max_grad_norm=0.0)
LOSS = LossConfig(clip_low=0.01, clip_high=100.0)
SEED, BATCHES = 11, 3
PROMPT = [257, 72, 105, 258, 257, 40, 41]
PLAN = ReducePlan(batch=0, cells=(0, 1), held=((), ()), dropped=(), final=False)  # cells 0 and 1 reduce


def _train(backend: TorchBackend, batches: int) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """Losses, batch-gradient norms and the final weights (on the CPU) of `batches` updates."""
    losses, norms = [], []
    for b in range(batches):
        steps, executions = synthetic_batch(SEED, b, DATA)
        clip = merge_shares((ratio_share(backend, s) for s in steps), executions, LOSS)
        backend.zero_gradients()
        losses.append(sum(gradient_share(backend, s, clip, LOSS) for s in steps))
        norms.append(backend.apply_update(backend.flat_gradients()))
    return losses, norms, {n: t.clone() for n, t in backend.named_tensors().items()}


@pytest.fixture(autouse=True)
def _no_tf32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def test_a_cuda_cell_trains_like_a_cpu_cell() -> None:
    on_cpu = TorchBackend(SPEC, SGD)
    on_gpu = TorchBackend(SPEC, SGD, TorchTraining(device="cuda"))
    assert next(on_gpu.model.parameters()).is_cuda
    cpu_losses, cpu_norms, cpu_weights = _train(on_cpu, BATCHES)
    gpu_losses, gpu_norms, gpu_weights = _train(on_gpu, BATCHES)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gpu_norms, cpu_norms, rtol=1e-4)
    assert min(cpu_norms) > 0
    for name, expected in cpu_weights.items():
        torch.testing.assert_close(gpu_weights[name], expected, rtol=1e-4, atol=1e-5, msg=name)


def test_bfloat16_on_the_gpu_keeps_float32_master_weights() -> None:
    reference = TorchBackend(SPEC, SGD, TorchTraining(device="cuda"))
    bf16 = TorchBackend(SPEC, SGD, TorchTraining(device="cuda", dtype="bfloat16"))
    ref_losses, ref_norms, _ = _train(reference, 1)
    losses, norms, weights = _train(bf16, 1)
    # bfloat16 keeps 8 bits of mantissa: a loss summed over a batch agrees to about 1%.
    np.testing.assert_allclose(losses, ref_losses, rtol=5e-2)
    np.testing.assert_allclose(norms, ref_norms, rtol=5e-2)
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    assert all(t.dtype == torch.float32 for t in weights.values())


def _two_cells(rank: int, port: int, out: str) -> None:
    """Cell `rank` of two, both on the one GPU, over gloo: each accumulates its half of a batch,
    the halves are reduced onto the core, the core updates and broadcasts, the satellite loads."""
    torch.backends.cuda.matmul.allow_tf32 = False
    with gloo_world(rank, 2, port):
        backend = TorchBackend(SPEC, SGD, TorchTraining(device="cuda"))
        replica = Replica(backend, RankLayout(2, rank, 0), LOSS, None, None)
        steps, executions = synthetic_batch(SEED, 0, DATA)
        clip = merge_shares((ratio_share(backend, s) for s in steps), executions, LOSS)
        replica.zero_gradients()
        loss = sum(replica.gradient(s, clip) for i, s in enumerate(steps) if i % 2 == rank)
        total = replica.reduce(PLAN, loss)
        if rank == 0:
            assert total is not None
            torch.save({"loss": total, "norm": replica.update()}, Path(out) / "core.pt")
            replica.expose(1)
        replica.broadcast(PLAN)
        torch.save(backend.named_tensors(), Path(out) / f"weights-{rank}.pt")


def test_two_cells_on_one_gpu_reduce_and_broadcast_like_one_process() -> None:
    alone = TorchBackend(SPEC, SGD)
    losses, norms, weights = _train(alone, 1)
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_two_cells, args=(free_port(), out), nprocs=2, start_method="spawn")
        core = torch.load(Path(out) / "core.pt")
        np.testing.assert_allclose(core["loss"], losses[0], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(core["norm"], norms[0], rtol=1e-4)
        for rank in (0, 1):
            got = torch.load(Path(out) / f"weights-{rank}.pt")
            for name, expected in weights.items():
                torch.testing.assert_close(got[name], expected, rtol=1e-4, atol=1e-5, msg=f"{rank} {name}")


def _served(url: str) -> GenerateResult:
    async def ask() -> GenerateResult:
        async with EngineClient(EngineClientConfig(url, timeout_s=120)) as engine:
            return await engine.generate(
                PROMPT, SamplingConfig(max_new_tokens=8, temperature=0.0, ignore_eos=True)
            )

    return asyncio.run(ask())


def _forward_logprobs(model: torch.nn.Module, output: list[int]) -> np.ndarray:
    """The logprobs of `output` after PROMPT by one forward pass over the whole sequence."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([PROMPT + output], device=device)).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[len(PROMPT) - 1 : -1]
    return logprobs.gather(1, torch.tensor(output, device=device)[:, None]).squeeze(1).cpu().numpy()


def test_the_reference_engine_decodes_on_the_gpu_like_on_the_cpu() -> None:
    results = []
    for device in ("cpu", "cuda"):
        config = ReferenceEngineConfig(source=ModelSource(seed=0, device=device))
        with ReferenceEngineServer(config) as server:
            model = server.engine.loaded.model
            assert next(model.parameters()).device.type == device
            result = _served(server.base_url)
            # Decoding step by step with the KV cache gives what one pass over the whole
            # sequence gives (a cache the model ignored would not: each step would see one token).
            np.testing.assert_allclose(
                result.logprobs, _forward_logprobs(model, result.output_ids.tolist()), atol=1e-4
            )
            results.append(result)
    on_cpu, on_gpu = results
    assert on_gpu.output_ids.tolist() == on_cpu.output_ids.tolist()
    np.testing.assert_allclose(on_gpu.logprobs, on_cpu.logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("method", ["tensor", "distributed"])
def test_a_gpu_core_publishes_to_a_gpu_engine(method: str, tmp_path: Path) -> None:
    backend = TorchBackend(ModelSpec(TINY_QWEN3, seed=3), SGD, TorchTraining(device="cuda"))
    _train(backend, 1)  # weights the engine has never seen
    engine_config = ReferenceEngineConfig(source=ModelSource(config=TINY_QWEN3, seed=0, device="cuda"))
    with ReferenceEngineServer(engine_config) as server:
        config = EnginePublisherConfig((server.base_url,), method, tmp_path, timeout_s=60)
        with EnginePublisher(config) as publisher:
            publisher.publish(backend, 5)
        result = _served(server.base_url)
        assert result.weight_version == "5"
        expected = _forward_logprobs(backend.model, result.output_ids.tolist())
        np.testing.assert_allclose(result.logprobs, expected, atol=1e-4, rtol=0)
