"""Megatron-core backend: every parallel layout trains one batch exactly like TP=1, PP=1.

Each layout is a gloo world of at most two processes that trains the same seeded GPTModel on the
same packed batch, once with clipped SGD and once with AdamW: tensor parallel 2, pipeline
parallel 2 (Megatron's 1F1B schedule), and data parallel 2 with Megatron's distributed optimizer
(micro-steps split over the two ranks, gradients summed, optimizer state sharded). All worlds
start together; the reference is a world of one. Needs megatron-core (skipped loudly without it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gyre_proxy.engines.refengine import free_port
from gyre_train import InvalidConfigError
from gyre_train.backends import OptimizerConfig, megatron_module
from gyre_train.cells import SyntheticBatchConfig, gradient_share, merge_shares, ratio_share, synthetic_batch
from gyre_train.objective import LossConfig
from tests.integration.train_stream.gloo import gloo_world
from tests.real_servers import megatron_missing, require

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True)
def _megatron() -> None:
    require("megatron", megatron_missing())


DATA = SyntheticBatchConfig(groups=2, executions=4, max_rows=2, vocab_size=128)
# A wide clip interval so that every execution contributes gradient.
LOSS = LossConfig(clip_low=0.01, clip_high=100.0)
# Each optimizer's tolerance on the weights after its steps, and how many batches it trains.
# SGD with an active clip (the batch gradient norm is about 0.05) moves every weight by the
# direction of its gradient only; unclipped SGD by lr * g, so its weights after three batches see
# every gradient's magnitude. AdamW's first step is about lr * g / (|g| + eps), which magnifies
# float rounding wherever |g| is near eps, so its tolerance is a fraction of lr.
OPTIMIZERS = {
    "sgd-clipped": (OptimizerConfig(kind="sgd", lr=1.0, max_grad_norm=0.01), 1e-6, 1),
    "sgd": (OptimizerConfig(kind="sgd", lr=1.0, max_grad_norm=0.0), 1e-7, 3),
    "adamw": (OptimizerConfig(lr=1e-2, max_grad_norm=1.0), 1e-4, 1),
}


@dataclass(frozen=True)
class Layout:
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    distributed_optimizer: bool = False

    @property
    def world(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel


REFERENCE = "tp1"
LAYOUTS = {
    REFERENCE: Layout(),
    "tp2": Layout(tensor_parallel=2),
    "pp2": Layout(pipeline_parallel=2),
    "dp2-distributed-optimizer": Layout(data_parallel=2, distributed_optimizer=True),
}


def _all(values: list[Any], group: Any) -> list[Any]:
    """Every data-parallel rank's list, concatenated in rank order."""
    parts: list[list[Any] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, values, group=group)
    return [v for part in parts if part is not None for v in part]


def _train_one_batch(backend: Any, optimizer_state: bool, batch: int) -> dict[str, Any]:
    """One batch on this rank's share of the micro-steps; sums over the data-parallel group."""
    group = megatron_module("megatron.core.parallel_state").get_data_parallel_group()
    steps, executions = synthetic_batch(11, batch, DATA)
    mine = steps[dist.get_rank(group) :: dist.get_world_size(group)]
    initial = backend.full_named_tensors()
    logprobs = _all([(s.index, backend.logprobs(s, grad=False)) for s in mine], group)
    clip = merge_shares(_all([ratio_share(backend, s) for s in mine], group), executions, LOSS)
    backend.zero_gradients()
    loss = torch.tensor(sum(gradient_share(backend, s, clip, LOSS) for s in mine), dtype=torch.float64)
    dist.all_reduce(loss, group=group)
    gradients = backend.full_named_gradients()
    for gradient in gradients.values():
        dist.all_reduce(gradient, group=group)
    flat = backend.flat_gradients()
    dist.all_reduce(flat, group=group)  # what cells.py hands the core: the batch gradient
    norm = backend.apply_update(flat)
    result = {
        "initial": initial,
        "logprobs": [t for _, t in sorted(logprobs, key=lambda pair: pair[0])],
        "loss": float(loss),
        "gradients": gradients,
        "norm": norm,
        "updated": backend.full_named_tensors(),
        "steps": len(steps),
        "mine": len(mine),
    }
    if optimizer_state:
        result["state_numel"] = backend.optimizer_state_numel()
        result["numel"] = backend.numel
    return result


def _world(rank: int, port: int, layout: Layout, output: str) -> None:
    """One rank: init gloo, one batch per optimizer; rank 0 saves what it saw."""
    from gyre_train.backends import MegatronBackend, MegatronModelSpec

    with gloo_world(rank, layout.world, port):
        spec = MegatronModelSpec(vocab_size=DATA.vocab_size, hidden_size=32, seed=7)
        results = {}
        for name, (optimizer, _, batches) in OPTIMIZERS.items():
            backend = MegatronBackend(
                spec,
                optimizer,
                tensor_parallel_size=layout.tensor_parallel,
                pipeline_parallel_size=layout.pipeline_parallel,
                distributed_optimizer=layout.distributed_optimizer,
            )
            try:
                with backend:
                    results[name] = [
                        _train_one_batch(backend, layout.distributed_optimizer, b) for b in range(batches)
                    ]
            except InvalidConfigError as exc:  # Megatron's distributed optimizer is Adam only
                results[name] = [{"refused": str(exc)}]
        gathered: list[Any] = [None] * layout.world
        dist.all_gather_object(gathered, results)
        if rank == 0:
            torch.save(gathered, output)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[dict[str, Any]]]]:
    """Every layout's per-rank results, the worlds run side by side."""
    root = tmp_path_factory.mktemp("megatron-layouts")
    contexts = {}
    for name, layout in LAYOUTS.items():
        context = mp.start_processes(
            _world,
            args=(free_port(), layout, str(root / f"{name}.pt")),
            nprocs=layout.world,
            join=False,
            start_method="spawn",
        )
        assert context is not None
        contexts[name] = context
    try:
        for context in contexts.values():
            while not context.join(timeout=200):
                pass
        yield {name: torch.load(root / f"{name}.pt") for name in LAYOUTS}
    finally:
        for context in contexts.values():
            for process in context.processes:
                if process.is_alive():
                    process.terminate()


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name != REFERENCE])
def test_layout_matches_tp1_pp1(
    trained: dict[str, list[dict[str, Any]]], layout: str, optimizer_name: str
) -> None:
    """Every step's logprobs, loss, gradient, norm and updated weights equal TP=1's; the first
    step starts from the very same weights, later ones from weights within the tolerance."""
    optimizer, update_atol, batches = OPTIMIZERS[optimizer_name]
    reference = trained[REFERENCE][0][optimizer_name]
    if LAYOUTS[layout].distributed_optimizer and optimizer.kind == "sgd":
        assert all("only runs AdamW" in r[optimizer_name][0]["refused"] for r in trained[layout])
        return
    assert len(reference) == batches
    for rank, ranked in enumerate(trained[layout]):
        assert len(ranked[optimizer_name]) == batches
        for step, (one, two) in enumerate(zip(reference, ranked[optimizer_name], strict=True)):
            assert one["steps"] >= 2  # gradients accumulate over several micro-steps
            assert list(two["initial"]) == list(one["initial"])  # TP=1, PP=1 names and order
            rtol, atol = (0.0, 0.0) if step == 0 else (1e-5, update_atol)  # the last step's check
            for name, tensor in one["initial"].items():
                torch.testing.assert_close(two["initial"][name], tensor, rtol=rtol, atol=atol)

            assert len(two["logprobs"]) == len(one["logprobs"]) == one["steps"]
            for a, b in zip(one["logprobs"], two["logprobs"], strict=True):
                assert bool((a != 0).any())
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
            assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7), (rank, step)
            assert two["norm"] == pytest.approx(one["norm"], rel=1e-5), (rank, step)

            assert one["gradients"].keys() == two["gradients"].keys()
            for name, gradient in one["gradients"].items():
                torch.testing.assert_close(two["gradients"][name], gradient, rtol=1e-4, atol=1e-6)
            moved = max(float((one["updated"][n] - one["initial"][n]).abs().max()) for n in one["updated"])
            assert moved > 1e-3  # the update is not trivially zero
            for name, tensor in one["updated"].items():
                torch.testing.assert_close(two["updated"][name], tensor, rtol=1e-5, atol=update_atol)


def test_distributed_optimizer_shards_its_state(trained: dict[str, list[dict[str, Any]]]) -> None:
    ranks = [r["adamw"][0] for r in trained["dp2-distributed-optimizer"]]
    assert [r["mine"] for r in ranks] == [ranks[0]["steps"] - ranks[0]["steps"] // 2, ranks[0]["steps"] // 2]
    numel = ranks[0]["numel"]
    # AdamW keeps two moments per value; each of the two ranks holds about half of them.
    assert sum(r["state_numel"] for r in ranks) == 2 * numel
    for r in ranks:
        assert r["numel"] == numel  # every data-parallel rank holds the whole model
        assert r["state_numel"] == pytest.approx(numel, rel=0.05)


def test_cpu_megatron_redirects_cuda_only_inside_the_block() -> None:
    import warnings

    from gyre_train.backends import cpu_megatron

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Megatron warns about Apex and Transformer Engine.
        mcore_random = megatron_module("megatron.core.tensor_parallel.random")
    originals = (torch.cuda.current_device, torch.zeros, torch.Tensor.type, torch.Tensor.cuda,
                 mcore_random._set_cuda_rng_state)  # fmt: skip
    with pytest.raises(RuntimeError, match="boom"), cpu_megatron(force=True) as patched:
        assert patched
        assert torch.cuda.current_device() == "cpu"
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.ones(2).cuda().device.type == "cpu"
        assert torch.ones(2).type() == "torch.cuda.FloatTensor"
        assert torch.ones(2).type(torch.float64).dtype == torch.float64  # conversions untouched
        raise RuntimeError("boom")  # the patches come off on the way out of an error too
    after = (torch.cuda.current_device, torch.zeros, torch.Tensor.type, torch.Tensor.cuda,
             mcore_random._set_cuda_rng_state)  # fmt: skip
    assert all(a is b for a, b in zip(after, originals, strict=True))
    assert torch.ones(2).type() == "torch.FloatTensor"
