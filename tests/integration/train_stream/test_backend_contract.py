"""One contract for every training backend: PyTorch in process, Megatron-core in gloo worlds.

The checks live in `backend_contract.py` and return plain values; each test here asserts one
clause of the `TrainingBackend` protocol on every subject. Megatron runs at TP=1 in a world of
one and at TP=2 and PP=2 in worlds of two (the subjects where reductions and point-to-point
sends matter), all started together when the first subject is set up.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from gyre_proxy.engines.refengine import free_port
from tests.real_servers import megatron_missing, require

from .backend_contract import (
    SGD_CLIPPED,
    SGD_PLAIN,
    MegatronLayout,
    Results,
    megatron_world,
    run_checks,
    torch_subject,
)

# Why Megatron-core cannot run here (None when it can); its subjects then fail with that
# reason unless GYRE_TEST_SKIP_MEGATRON=1.
MEGATRON_MISSING = megatron_missing()
LAYOUTS = {
    "megatron-tp1": MegatronLayout(tensor_parallel=1),
    "megatron-tp2": MegatronLayout(tensor_parallel=2),
    "megatron-pp2": MegatronLayout(pipeline_parallel=2),
}
SUBJECTS = ["torch", *LAYOUTS]

pytestmark = pytest.mark.timeout(180)


class _Worlds:
    """Every Megatron world, started at once on first use; results read back on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.contexts: dict[str, mp.ProcessContext] = {}
        self.results: dict[str, dict[str, Results]] = {}

    def start(self) -> None:
        if self.contexts or MEGATRON_MISSING is not None:
            return
        for name, layout in LAYOUTS.items():
            workdir = self.root / name
            workdir.mkdir()
            context = mp.start_processes(
                megatron_world,
                args=(free_port(), layout, str(workdir)),
                nprocs=layout.world,
                join=False,
                start_method="spawn",
            )
            assert context is not None
            self.contexts[name] = context

    def get(self, name: str) -> dict[str, Results]:
        if name not in self.results:
            self.start()
            context = self.contexts[name]
            while not context.join(timeout=150):
                pass
            self.results[name] = torch.load(self.root / name / "results.pt")
        return self.results[name]

    def close(self) -> None:
        for context in self.contexts.values():
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
                    process.join()


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Worlds]:
    worlds = _Worlds(tmp_path_factory.mktemp("megatron-worlds"))
    yield worlds
    worlds.close()


@pytest.fixture(scope="module", params=SUBJECTS)
def contract(
    request: pytest.FixtureRequest, worlds: _Worlds, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Every check's results for one backend, and its name."""
    name: str = request.param
    if name == "torch":
        worlds.start()  # the Megatron worlds run while the PyTorch checks do
        results = run_checks(torch_subject(), tmp_path_factory.mktemp("torch-contract"))
    else:
        require("megatron", MEGATRON_MISSING)
        results = worlds.get(name)
    return {"name": name, **results}


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=atol)


def test_logprobs_are_packed_log_probabilities(contract: dict[str, Any]) -> None:
    r = contract["logprobs"]
    assert len(r["lengths"]) >= 2
    rows = zip(r["without_grad"], r["lengths"], r["row_starts"], r["targets"], strict=True)
    for logprobs, length, starts, targets in rows:
        assert logprobs.shape == (length,)
        assert logprobs.dtype == torch.float32
        assert bool((logprobs <= 0).all())
        # A row's first token has no prediction inside its row.
        assert torch.equal(logprobs[starts], torch.zeros(len(starts)))
        # Every target the loss reads is a real log probability (a backend may skip the others).
        assert bool(targets.any())
        assert bool((logprobs[targets] < 0).all())
    if r["with_grad"] is None:
        # Only a pipeline refuses a graph (its stages are other processes); pass 2 still works.
        assert contract["name"].endswith("pp2")
        return
    for without, with_grad in zip(r["without_grad"], r["with_grad"], strict=True):
        _close(with_grad, without)
    assert all(r["requires_grad"])


def test_accumulate_gradients_returns_the_loss_and_sums_micro_steps(contract: dict[str, Any]) -> None:
    r = contract["accumulate"]
    assert r["value"] == pytest.approx(r["expected"], rel=1e-5, abs=1e-8)
    assert r["value"] != 0.0
    assert bool((r["g_first"] != 0).any())
    assert bool((r["g_second"] != 0).any())
    assert r["g_first"].shape == (r["numel"],)
    _close(r["g_both"], r["g_first"] + r["g_second"], atol=1e-7)


def test_zero_gradients_zeroes(contract: dict[str, Any]) -> None:
    r = contract["accumulate"]
    assert r["nonzero_before_zeroing"]
    assert r["after_zero"].shape == (r["numel"],)
    assert not bool(r["after_zero"].any())


def test_flat_parameters_round_trip(contract: dict[str, Any]) -> None:
    r = contract["flat_parameters"]
    assert r["initial"].shape == (r["numel"],)
    assert r["initial"].dtype == torch.float32
    assert torch.equal(r["loaded"], r["shifted"])
    assert not torch.equal(r["loaded"], r["initial"])
    assert len(r["errors"]) == 2  # too short and too long both raise InvalidConfigError
    assert all(str(r["numel"] - 1) in e or str(r["numel"] + 1) in e for e in r["errors"])
    assert torch.equal(r["unchanged"], r["shifted"])  # a refused load changes nothing


@pytest.mark.parametrize("kind", ["clipped", "plain"])
def test_apply_update_is_gradient_descent_on_the_clipped_global_gradient(
    contract: dict[str, Any], kind: str
) -> None:
    r = contract["sgd_update"][kind]
    config = SGD_CLIPPED if kind == "clipped" else SGD_PLAIN
    whole_norm = float(torch.linalg.vector_norm(r["whole"].double()))
    assert whole_norm > 0
    assert r["norm"] == pytest.approx(whole_norm, rel=1e-5)
    scale = min(1.0, config.max_grad_norm / (r["norm"] + 1e-6)) if config.max_grad_norm > 0 else 1.0
    if kind == "clipped":
        assert scale < 0.5  # the clip is active
    _close(r["after"], r["before"] - config.lr * scale * r["gradient"], atol=1e-7)
    assert not bool(r["left"].any())  # the update leaves no gradient behind


def test_training_on_a_batch_lowers_its_loss(contract: dict[str, Any]) -> None:
    r = contract["training"]
    surrogates: list[float] = r["surrogates"]
    assert r["moved"] > 0
    assert all(loss != 0.0 for loss in r["losses"])
    # Every update lowers the advantage-weighted negative log-likelihood of the batch.
    assert all(b < a for a, b in pairwise(surrogates))
    assert surrogates[-1] < surrogates[0] - 0.05 * abs(surrogates[0])


def test_save_writes_what_named_tensors_holds(contract: dict[str, Any]) -> None:
    r = contract["save"]
    assert r["written_exists"]
    named: dict[str, Any] = r["named"]
    loaded: dict[str, Any] = r["loaded"]
    assert named
    assert named.keys() == loaded.keys()
    for name, tensor in named.items():
        assert torch.equal(loaded[name], tensor), name
