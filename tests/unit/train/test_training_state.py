"""A core resumed from a publication goes on with its optimizer's moments: the update it makes
equals the one the core that kept running made, and the publisher keeps the newest state only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from gyre_store import EngineRegistered, InMemoryEventLog, NewEvent
from gyre_train.backends import ModelSpec, OptimizerConfig, TorchBackend
from gyre_train.cells import TINY_QWEN3, LivePublisher, resume_point
from gyre_train.exceptions import InvalidConfigError

ADAMW = OptimizerConfig(kind="adamw", lr=1e-2, max_grad_norm=0.0)


def _gradients(numel: int, n: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randn(numel, generator=generator) for _ in range(n)]


def test_a_resumed_core_makes_the_update_the_running_core_made(tmp_path: Path) -> None:
    running = TorchBackend(ModelSpec(config=TINY_QWEN3, seed=0), ADAMW)
    first, second = _gradients(running.numel, 2)
    running.apply_update(first)
    running.save(tmp_path / "policy")
    assert running.save_training_state(tmp_path / "optimizer.pt") == tmp_path / "optimizer.pt"
    before = running.flat_parameters().clone()
    running.apply_update(second)
    expected = running.flat_parameters() - before  # the second update, as the running core made it

    spec = ModelSpec(config={}, model_dir=tmp_path / "policy")
    resumed = TorchBackend(spec, dataclasses.replace(ADAMW, state_path=tmp_path / "optimizer.pt"))
    assert torch.equal(resumed.flat_parameters(), before)
    resumed.apply_update(second)
    torch.testing.assert_close(resumed.flat_parameters() - before, expected, rtol=1e-5, atol=1e-8)

    fresh = TorchBackend(spec, ADAMW)  # what a resume without the state did: moments from zero
    fresh.apply_update(second)
    gap = float((fresh.flat_parameters() - before - expected).abs().max())
    assert gap > 100 * float(expected.abs().max()) * 1e-5  # the moments matter: a wrong resume shows


def test_no_update_yet_keeps_nothing_and_a_missing_state_is_refused(tmp_path: Path) -> None:
    backend = TorchBackend(ModelSpec(config=TINY_QWEN3, seed=0), ADAMW)
    assert backend.save_training_state(tmp_path / "optimizer.pt") is None
    missing = OptimizerConfig(kind="adamw", state_path=tmp_path / "nowhere.pt")
    with pytest.raises(InvalidConfigError, match="no optimizer state"):
        TorchBackend(ModelSpec(config=TINY_QWEN3, seed=0), missing).apply_update(torch.zeros(backend.numel))


def test_the_publisher_keeps_the_newest_state_and_the_resume_point_finds_it(tmp_path: Path) -> None:
    log = InMemoryEventLog()
    # An engine that cannot be reached is skipped: the policy and its state are kept all the same.
    log.append(
        [
            NewEvent(
                EngineRegistered(engine="run:pool-0", run_id="run", url="http://127.0.0.1:9", cell_index=-1)
            )
        ]
    )
    publisher = LivePublisher(log, "run", tmp_path, timeout_s=2.0)
    backend = TorchBackend(ModelSpec(config=TINY_QWEN3, seed=0), ADAMW)
    for version, gradient in enumerate(_gradients(backend.numel, 2), start=1):
        backend.apply_update(gradient)
        publisher.publish(backend, version)
    assert sorted(p.name for p in tmp_path.glob("*.optimizer.pt")) == ["policy-v2.optimizer.pt"]
    from gyre_store import WeightsPublished

    log.append([NewEvent(WeightsPublished(run_id="run", policy_version=v, step=v - 1)) for v in (1, 2)])
    resume = resume_point(log, "run", 1, tmp_path)
    assert (resume.version, resume.model_dir, resume.training_state) == (
        2,
        tmp_path / "policy-v2",
        tmp_path / "policy-v2.optimizer.pt",
    )
