"""The training-backend contract as checks that take a backend factory and return plain values.

Each check builds fresh backends from `BackendUnderTest.make`, exercises one part of the
`TrainingBackend` protocol and returns tensors, floats and flags; `test_backend_contract.py`
asserts on them. A Megatron backend needs `torch.distributed`, so its checks run inside spawned
worlds (`megatron_world`) and come back through a file; the PyTorch backend runs them in process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gyre_train import InvalidConfigError
from gyre_train.backends import ModelSpec, OptimizerConfig, TorchBackend, TrainingBackend
from gyre_train.cells import (
    TINY_QWEN3,
    ExecutionTotals,
    SyntheticBatchConfig,
    gradient_share,
    merge_shares,
    ratio_share,
    synthetic_batch,
    train_batch_locally,
)
from gyre_train.objective import LossConfig, micro_step_loss
from gyre_train.trajectories import MicroStep
from tests.integration.train_stream.gloo import gloo_world

DATA = SyntheticBatchConfig(groups=2, executions=2, max_rows=2, vocab_size=128, token_budget=48)
# A wide clip interval so that every execution contributes gradient.
LOSS = LossConfig(clip_low=0.01, clip_high=100.0)
# An active clip: the batch gradient norm of these tiny models is far above 1e-3.
SGD_CLIPPED = OptimizerConfig(kind="sgd", lr=0.5, max_grad_norm=1e-3)
SGD_PLAIN = OptimizerConfig(kind="sgd", lr=0.5, max_grad_norm=0.0)
ADAMW = OptimizerConfig(lr=3e-3, max_grad_norm=1.0)
TRAIN_STEPS = 4

Results = dict[str, Any]


@dataclass(frozen=True)
class BackendUnderTest:
    """How the checks reach one backend.

    make: a fresh backend (a context manager) with the given optimizer.
    whole_gradient: the accumulated gradient of the whole model (collective for sharded backends).
    load_saved: what `save` wrote, read back as name -> tensor.
    """

    make: Callable[[OptimizerConfig], AbstractContextManager[TrainingBackend]]
    whole_gradient: Callable[[TrainingBackend], torch.Tensor]
    load_saved: Callable[[Path], dict[str, torch.Tensor]]


def batch() -> tuple[list[MicroStep], tuple[ExecutionTotals, ...]]:
    return synthetic_batch(5, 0, DATA)


def _loss_of(backend: TrainingBackend, steps: list[MicroStep], executions: Any) -> Callable[..., Any]:
    """Pass 1 over the batch, then a function that runs pass 2 of one micro-step."""
    clip = merge_shares((ratio_share(backend, s) for s in steps), executions, LOSS)
    return lambda step: gradient_share(backend, step, clip, LOSS)


def check_logprobs(subject: BackendUnderTest, workdir: Path) -> Results:
    steps, _ = batch()
    with subject.make(ADAMW) as backend:
        without = [backend.logprobs(s, grad=False) for s in steps]
        try:
            with_grad: list[torch.Tensor] | None = [backend.logprobs(s, grad=True) for s in steps]
        except InvalidConfigError:  # a pipeline keeps no graph across its stages
            with_grad = None
    return {
        "without_grad": without,
        "with_grad": None if with_grad is None else [t.detach() for t in with_grad],
        "requires_grad": None if with_grad is None else [t.requires_grad for t in with_grad],
        "lengths": [len(s) for s in steps],
        "row_starts": [s.row_starts[:-1].tolist() for s in steps],
        # The loss reads logprobs at these positions only; a backend may leave the others at 0.
        "targets": [torch.from_numpy(s.target_mask & (s.position_ids > 0)) for s in steps],
    }


def check_accumulate(subject: BackendUnderTest, workdir: Path) -> Results:
    steps, executions = batch()
    with subject.make(ADAMW) as backend:
        clip = merge_shares((ratio_share(backend, s) for s in steps), executions, LOSS)
        first, second = steps[0], steps[1]
        expected = float(micro_step_loss(first, backend.logprobs(first, grad=False), clip, LOSS).loss)
        backend.zero_gradients()
        value = gradient_share(backend, first, clip, LOSS)
        g_first = backend.flat_gradients().clone()
        backend.zero_gradients()
        gradient_share(backend, second, clip, LOSS)
        g_second = backend.flat_gradients().clone()
        backend.zero_gradients()
        both = gradient_share(backend, first, clip, LOSS) + gradient_share(backend, second, clip, LOSS)
        g_both = backend.flat_gradients().clone()
        nonzero_before_zeroing = bool((g_both != 0).any())
        backend.zero_gradients()
        after_zero = backend.flat_gradients()
        numel = backend.numel
    return {
        "value": value,
        "expected": expected,
        "both": both,
        "g_first": g_first,
        "g_second": g_second,
        "g_both": g_both,
        "nonzero_before_zeroing": nonzero_before_zeroing,
        "after_zero": after_zero,
        "numel": numel,
    }


def check_flat_parameters(subject: BackendUnderTest, workdir: Path) -> Results:
    with subject.make(ADAMW) as backend:
        initial = backend.flat_parameters().clone()
        shifted = initial + torch.linspace(-1.0, 1.0, initial.numel())
        backend.load_flat_parameters(shifted)
        loaded = backend.flat_parameters().clone()
        errors = []
        for wrong in (initial[:-1], torch.cat([initial, initial[:1]])):
            try:
                backend.load_flat_parameters(wrong)
            except InvalidConfigError as exc:
                errors.append(str(exc))
        unchanged = backend.flat_parameters().clone()
        numel = backend.numel
    return {
        "initial": initial,
        "shifted": shifted,
        "loaded": loaded,
        "errors": errors,
        "unchanged": unchanged,
        "numel": numel,
    }


def _one_update(subject: BackendUnderTest, optimizer: OptimizerConfig) -> Results:
    steps, executions = batch()
    with subject.make(optimizer) as backend:
        run = _loss_of(backend, steps, executions)
        backend.zero_gradients()
        for step in steps:
            run(step)
        before = backend.flat_parameters().clone()
        gradient = backend.flat_gradients().clone()
        whole = subject.whole_gradient(backend).clone()
        norm = backend.apply_update(gradient)
        after = backend.flat_parameters().clone()
        left = backend.flat_gradients().clone()
    return {"before": before, "gradient": gradient, "whole": whole, "norm": norm, "after": after,
            "left": left}  # fmt: skip


def check_sgd_update(subject: BackendUnderTest, workdir: Path) -> Results:
    return {"clipped": _one_update(subject, SGD_CLIPPED), "plain": _one_update(subject, SGD_PLAIN)}


def _surrogate(backend: TrainingBackend, steps: list[MicroStep]) -> float:
    """-sum_u c_u A_i logp(y_u): the loss with every ratio weight and clip mask frozen at 1.

    The gyre loss itself re-weights each token by its current ratio, so its value can rise while
    the policy moves the right way; this fixed objective cannot.
    """
    total = 0.0
    for step in steps:
        logprobs = backend.logprobs(step, grad=False).double()  # [T]
        weights = torch.from_numpy(step.coefficients * step.advantages * step.target_mask)  # [T]
        total -= float((weights * logprobs).sum())
    return total


def check_training(subject: BackendUnderTest, workdir: Path) -> Results:
    steps, executions = batch()
    with subject.make(ADAMW) as backend:
        before = backend.flat_parameters().clone()
        surrogates = [_surrogate(backend, steps)]
        losses = []
        for _ in range(TRAIN_STEPS):
            losses.append(train_batch_locally(backend, steps, executions, LOSS).loss)
            surrogates.append(_surrogate(backend, steps))
        after = backend.flat_parameters().clone()
    return {"losses": losses, "surrogates": surrogates, "moved": float((after - before).abs().max())}


def check_save(subject: BackendUnderTest, workdir: Path) -> Results:
    with subject.make(ADAMW) as backend:
        backend.load_flat_parameters(backend.flat_parameters() * 1.5)  # not the seeded weights
        written = backend.save(workdir / "saved")
        named = {name: t.clone() for name, t in backend.named_tensors().items()}
    return {"named": named, "loaded": subject.load_saved(written), "written_exists": written.exists()}


CHECKS: dict[str, Callable[[BackendUnderTest, Path], Results]] = {
    "logprobs": check_logprobs,
    "accumulate": check_accumulate,
    "flat_parameters": check_flat_parameters,
    "sgd_update": check_sgd_update,
    "training": check_training,
    "save": check_save,
}


def run_checks(subject: BackendUnderTest, workdir: Path) -> dict[str, Results]:
    return {name: check(subject, workdir / name) for name, check in CHECKS.items()}


# -- the PyTorch backend, in process ---------------------------------------------------------


@contextmanager
def _plain(backend: TrainingBackend) -> Iterator[TrainingBackend]:
    yield backend


def _load_pretrained(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path))
    return {name: t.detach() for name, t in model.state_dict().items()}


def torch_subject() -> BackendUnderTest:
    spec = ModelSpec(TINY_QWEN3, seed=3)
    return BackendUnderTest(
        make=lambda optimizer: _plain(TorchBackend(spec, optimizer)),
        whole_gradient=lambda backend: backend.flat_gradients(),
        load_saved=_load_pretrained,
    )


# -- Megatron-core, in spawned worlds ---------------------------------------------------------


@dataclass(frozen=True)
class MegatronLayout:
    """How a Megatron world splits the model; the world size is their product."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    @property
    def world(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


def _megatron_subject(layout: MegatronLayout) -> BackendUnderTest:
    from gyre_train.backends import MegatronBackend, MegatronModelSpec

    spec = MegatronModelSpec(vocab_size=DATA.vocab_size, hidden_size=32, seed=3)

    def whole(backend: TrainingBackend) -> torch.Tensor:
        assert isinstance(backend, MegatronBackend)
        return torch.cat([g.reshape(-1) for g in backend.full_named_gradients().values()])

    return BackendUnderTest(
        make=lambda optimizer: MegatronBackend(
            spec,
            optimizer,
            tensor_parallel_size=layout.tensor_parallel,
            pipeline_parallel_size=layout.pipeline_parallel,
        ),
        whole_gradient=whole,
        load_saved=lambda path: torch.load(path),
    )


def megatron_world(rank: int, port: int, layout: MegatronLayout, workdir: str) -> None:
    """One rank of a Megatron world: every check, collectively; rank 0 writes the results."""
    with gloo_world(rank, layout.world, port):
        results = run_checks(_megatron_subject(layout), Path(workdir) / f"rank{rank}")
        if rank == 0:
            torch.save(results, Path(workdir) / "results.pt")
