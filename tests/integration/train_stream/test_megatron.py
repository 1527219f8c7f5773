"""Megatron-core backend: tensor parallel 2 over gloo equals the same model at TP=1.

Three processes run at once: a TP=1 world of one and a TP=2 world of two, each training the same
seeded GPTModel on the same packed batch through `train_batch_locally`. Needs megatron-core
(`pip install megatron-core==0.16.1`); skipped loudly without it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gyre_proxy.refengine import free_port
from gyre_train.backend_torch import OptimizerConfig
from gyre_train.local_training import gradient_share, merge_shares, ratio_share
from gyre_train.loss import LossConfig
from gyre_train.streaming_run import SyntheticBatchConfig, synthetic_batch

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
        reason="MEGATRON-CORE NOT INSTALLED: the Megatron backend is untested "
        "(pip install megatron-core==0.16.1)",
    ),
    pytest.mark.timeout(120),
]

DATA = SyntheticBatchConfig(groups=2, executions=4, max_rows=2, vocab_size=128)
# A wide clip interval so that every execution contributes gradient.
LOSS = LossConfig(clip_low=0.01, clip_high=100.0)
# SGD with an active clip (the batch gradient norm is about 0.05) checks the update tightly;
# AdamW's first step is about lr * g / (|g| + eps), which magnifies float rounding wherever |g| is
# near eps, so its tolerance is a fraction of lr.
OPTIMIZERS = {
    "sgd-clipped": (OptimizerConfig(kind="sgd", lr=1.0, max_grad_norm=0.01), 1e-6),
    "adamw": (OptimizerConfig(lr=1e-2, max_grad_norm=1.0), 1e-4),
}


def _train_one_batch(rank: int, world: int, port: int, optimizer: OptimizerConfig, output: str) -> None:
    """One rank: init gloo, one batch (pass 1, pass 2, update), rank 0 saves what it saw."""
    import warnings

    warnings.filterwarnings("ignore")  # Megatron warns about Apex and Transformer Engine.
    from gyre_train.backend_megatron import MegatronBackend, MegatronModelSpec

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        spec = MegatronModelSpec(vocab_size=DATA.vocab_size, hidden_size=32, seed=7)
        with MegatronBackend(spec, optimizer, tensor_parallel_size=world) as backend:
            steps, executions = synthetic_batch(11, 0, DATA)
            initial = backend.full_named_tensors()
            logprobs = [backend.logprobs(s, grad=False) for s in steps]
            clip = merge_shares((ratio_share(backend, s) for s in steps), executions, LOSS)
            backend.zero_gradients()
            loss = sum(gradient_share(backend, s, clip, LOSS) for s in steps)
            gradients = backend.full_named_gradients()
            norm = backend.apply_update(backend.flat_gradients())
            updated = backend.full_named_tensors()
        if rank == 0:
            torch.save(
                {"initial": initial, "logprobs": logprobs, "loss": loss, "gradients": gradients,
                 "norm": norm, "updated": updated, "steps": len(steps)},
                output,
            )  # fmt: skip
    finally:
        dist.destroy_process_group()


def _launch(world: int, optimizer: OptimizerConfig, output: Path) -> mp.ProcessContext:
    context = mp.start_processes(
        _train_one_batch,
        args=(world, free_port(), optimizer, str(output)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    assert context is not None
    return context


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_tensor_parallel_2_matches_tensor_parallel_1(tmp_path: Path, optimizer_name: str) -> None:
    optimizer, update_atol = OPTIMIZERS[optimizer_name]
    tp1 = _launch(1, optimizer, tmp_path / "tp1.pt")
    tp2 = _launch(2, optimizer, tmp_path / "tp2.pt")
    for context in (tp1, tp2):
        while not context.join(timeout=100):
            pass
    one = torch.load(tmp_path / "tp1.pt")
    two = torch.load(tmp_path / "tp2.pt")

    assert one["steps"] >= 2  # gradients accumulate over several micro-steps
    for name, tensor in one["initial"].items():
        torch.testing.assert_close(two["initial"][name], tensor, rtol=0, atol=0)

    for a, b in zip(one["logprobs"], two["logprobs"], strict=True):
        assert bool((a != 0).any())
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
    assert two["norm"] == pytest.approx(one["norm"], rel=1e-5)

    assert one["gradients"].keys() == two["gradients"].keys()
    for name, gradient in one["gradients"].items():
        torch.testing.assert_close(two["gradients"][name], gradient, rtol=1e-4, atol=1e-6)
    moved = max(float((one["updated"][n] - one["initial"][n]).abs().max()) for n in one["updated"])
    assert moved > 1e-3  # the update is not trivially zero
    for name, tensor in one["updated"].items():
        torch.testing.assert_close(two["updated"][name], tensor, rtol=1e-5, atol=update_atol)
