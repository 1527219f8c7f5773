"""A Qwen3 checkpoint in Megatron-core: converted, trained split over ranks, and exported back.

Two tiny Qwen3 checkpoints (grouped-query attention, SwiGLU, rotary positions, QK-norm), one
with tied embeddings and one untied. A TP=2 world trains the tied one and a PP=2 world the
untied one (Megatron keeps a tied output layer on the embedding's stage only, so PP needs it
untied), each on gloo in spawned processes; the reference is gyre's PyTorch backend on the same
checkpoint in this process. Every batch's loss, gradient norm and logprobs, and the weights
after several unclipped SGD steps, must equal the reference's. The TP=2 world also exports its
untrained model to a Hugging Face folder, which must be the checkpoint again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from gyre_proxy.engines.refengine import free_port
from gyre_train.backends import ModelSpec, OptimizerConfig, TorchBackend
from gyre_train.cells import (
    TINY_QWEN3,
    SyntheticBatchConfig,
    gradient_share,
    merge_shares,
    ratio_share,
    synthetic_batch,
)
from gyre_train.objective import LossConfig
from tests.integration.train_stream.gloo import gloo_world
from tests.real_servers import megatron_missing, require

pytestmark = pytest.mark.timeout(300)

DATA = SyntheticBatchConfig(groups=2, executions=4, max_rows=2, vocab_size=200)
LOSS = LossConfig(clip_low=0.01, clip_high=100.0)  # wide: every execution contributes gradient
# Unclipped SGD: the weights after each step carry every gradient's magnitude.
SGD = OptimizerConfig(kind="sgd", lr=20.0, max_grad_norm=0.0)
ADAMW = OptimizerConfig(lr=1e-2, max_grad_norm=1.0)  # its moments are what a resumed core keeps
BATCHES = 3
# gyre's tiny Qwen3 with rotary and norm settings unlike the defaults, so a dropped one shows.
TINY = {**TINY_QWEN3, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6}
# (checkpoint, TP, PP) of each Megatron world.
LAYOUTS = {"tp2": ("tied", 2, 1), "pp2": ("untied", 1, 2)}
# Float32 rounding is all that may differ: Megatron sums TP shards' partial products in another
# order, runs rotary angles over the packed step's positions (the reference restarts them per
# row; a rotary score depends only on the query-key distance), and computes softmax through its
# vocab-parallel cross entropy. Measured: logprobs (about -5.5) within 1e-6, weights within 7e-8,
# gradient norms within 2e-6 relative; a wrong gradient scale moves the norm by that scale and
# the weights by a share of the update (each step moves some weight by more than 1e-2).
LOGPROB_ATOL = 2e-5
WEIGHT_ATOL = 1e-6
RTOL = 2e-5


def write_tiny(folder: Path, *, tied: bool, seed: int = 5) -> Path:
    """A save_pretrained Qwen3 of TINY's shape, random weights from `seed`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {**TINY, "tie_word_embeddings": tied}
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(seed)
    model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    with torch.no_grad():  # norms away from 1, so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(str(folder))
    return folder


def train(backend: Any, named: Any, batches: range = range(BATCHES)) -> list[dict[str, Any]]:
    """Each batch: pass 1, pass 2 over every micro-step, one update."""
    out = []
    for batch in batches:
        steps, executions = synthetic_batch(11, batch, DATA)
        # Logprobs at the targets only: the PyTorch backend computes a Qwen3's there alone.
        logprobs = [backend.logprobs(s, grad=False) * torch.tensor(s.target_mask) for s in steps]
        clip = merge_shares([ratio_share(backend, s) for s in steps], executions, LOSS)
        backend.zero_gradients()
        loss = sum(gradient_share(backend, s, clip, LOSS) for s in steps)
        norm = backend.apply_update(backend.flat_gradients())
        out.append({"logprobs": logprobs, "loss": float(loss), "norm": norm, "weights": named()})
    return out


def _world(rank: int, port: int, layout: str, folder: str, output: str) -> None:
    from gyre_train.backends import MegatronBackend
    from gyre_train.backends.megatron_export import export_model
    from gyre_train.backends.megatron_qwen3 import qwen3_spec

    _, tp, pp = LAYOUTS[layout]
    with gloo_world(rank, tp * pp, port):
        spec = qwen3_spec(Path(folder), max_sequence_length=256)
        with MegatronBackend(spec, SGD, tensor_parallel_size=tp, pipeline_parallel_size=pp) as backend:

            def named() -> dict[str, torch.Tensor]:
                return export_model(spec, backend.full_named_tensors()).state

            exported = export_model(spec, backend.full_named_tensors())
            if rank == 0:
                exported.save(Path(output).with_suffix(".hf"))
            result: dict[str, Any] = {"rank": rank, "batches": train(backend, named)}
        if layout == "tp2":
            result["resume"] = _resume(rank, spec, tp, Path(output))
        if rank == 0:
            torch.save(result, output)


def _resume(rank: int, spec: Any, tp: int, output: Path) -> dict[str, dict[str, torch.Tensor]]:
    """AdamW over batches 0 and 1 without a stop (`continued`); resumed after batch 0 from the
    published folder with the kept optimizer state (`resumed`) and without it (`fresh`)."""
    import torch.distributed as dist

    from gyre_train.backends import MegatronBackend
    from gyre_train.backends.megatron_export import export_model
    from gyre_train.backends.megatron_qwen3 import qwen3_spec

    kept, published = output.with_suffix(".optimizer.pt"), output.with_suffix(".v1")
    out = {}
    with MegatronBackend(spec, ADAMW, tensor_parallel_size=tp) as backend:
        train(backend, dict, range(1))
        state = backend.gathered_training_state()  # collective
        exported = export_model(spec, backend.full_named_tensors())
        if rank == 0:
            exported.save(published)
            torch.save(state, kept)
        train(backend, dict, range(1, 2))
        out["continued"] = export_model(spec, backend.full_named_tensors()).state
    dist.barrier()
    again = qwen3_spec(published, max_sequence_length=spec.max_sequence_length)
    for name, config in (("resumed", replace(ADAMW, state_path=kept)), ("fresh", ADAMW)):
        with MegatronBackend(again, config, tensor_parallel_size=tp) as backend:
            train(backend, dict, range(1, 2))
            out[name] = export_model(again, backend.full_named_tensors()).state
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3")
    return {name: write_tiny(root / name, tied=name == "tied") for name in ("tied", "untied")}


@pytest.fixture(scope="module")
def megatron(
    checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Each Megatron world's rank-0 results and exported folder, the worlds run side by side."""
    require("megatron", megatron_missing())
    root = tmp_path_factory.mktemp("megatron-qwen3")
    contexts = {}
    for layout, (checkpoint, tp, pp) in LAYOUTS.items():
        args = (free_port(), layout, str(checkpoints[checkpoint]), str(root / f"{layout}.pt"))
        contexts[layout] = mp.start_processes(
            _world, args=args, nprocs=tp * pp, join=False, start_method="spawn"
        )
    try:
        for context in contexts.values():
            assert context is not None
            while not context.join(timeout=250):
                pass
        yield {layout: (torch.load(root / f"{layout}.pt"), root / f"{layout}.hf") for layout in LAYOUTS}
    finally:
        for context in contexts.values():
            for process in context.processes if context is not None else ():
                if process.is_alive():
                    process.terminate()


def reference(folder: Path) -> list[dict[str, Any]]:
    backend = TorchBackend(ModelSpec(config={}, model_dir=folder), SGD)
    return train(backend, lambda: {k: v.clone() for k, v in backend.named_tensors().items()})


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_trains_like_the_pytorch_reference(
    layout: str, megatron: dict[str, Any], checkpoints: dict[str, Path]
) -> None:
    result, _ = megatron[layout]
    expected = reference(checkpoints[LAYOUTS[layout][0]])
    initial = TorchBackend(ModelSpec(config={}, model_dir=checkpoints[LAYOUTS[layout][0]])).named_tensors()
    for step, (one, two) in enumerate(zip(expected, result["batches"], strict=True)):
        assert one["norm"] > 1e-3, step  # the batch has gradient
        assert two["loss"] == pytest.approx(one["loss"], rel=RTOL, abs=1e-6), step
        assert two["norm"] == pytest.approx(one["norm"], rel=RTOL), step
        assert len(one["logprobs"]) == len(two["logprobs"]) >= 2
        for a, b in zip(one["logprobs"], two["logprobs"], strict=True):
            assert bool((a != 0).any())
            torch.testing.assert_close(b, a, rtol=0.0, atol=LOGPROB_ATOL)
        assert two["weights"].keys() == one["weights"].keys()
        for name, tensor in one["weights"].items():
            torch.testing.assert_close(two["weights"][name], tensor, rtol=0.0, atol=WEIGHT_ATOL)
    moved = max(float((expected[-1]["weights"][n] - initial[n]).abs().max()) for n in initial)
    assert moved > 1e4 * WEIGHT_ATOL  # the steps move the weights well beyond the tolerance


def test_export_gives_back_the_checkpoint(megatron: dict[str, Any], checkpoints: dict[str, Path]) -> None:
    """HF -> Megatron (TP=2, tied) -> HF: the same tensors, so the same logprobs, exactly (the
    conversion only moves values, and the same model code computes both)."""
    _, exported = megatron["tp2"]
    original = TorchBackend(ModelSpec(config={}, model_dir=checkpoints["tied"]))
    again = TorchBackend(ModelSpec(config={}, model_dir=exported))
    assert again.named_tensors().keys() == original.named_tensors().keys()
    for name, tensor in original.named_tensors().items():
        assert torch.equal(again.named_tensors()[name], tensor), name
    steps, _ = synthetic_batch(11, 0, DATA)
    for step in steps:
        assert torch.equal(again.logprobs(step, grad=False), original.logprobs(step, grad=False))


def test_a_resumed_core_goes_on_with_the_kept_optimizer_state(megatron: dict[str, Any]) -> None:
    """Publication v1 with its kept AdamW moments, resumed in new processes' backends: batch 1
    then moves the weights as the run that never stopped did; without the state it does not."""
    result, _ = megatron["tp2"]
    continued, resumed, fresh = (result["resume"][k] for k in ("continued", "resumed", "fresh"))
    for name, tensor in continued.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0.0, atol=WEIGHT_ATOL)
    assert max(float((fresh[n] - t).abs().max()) for n, t in continued.items()) > 1e-3
