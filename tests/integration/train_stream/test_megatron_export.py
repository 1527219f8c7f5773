"""Megatron-core GPT weights exported as a Hugging Face GPT-2 give the same logprobs.

Megatron runs in a spawned process (it needs torch.distributed); the exported model runs here
through the same packed-logprob function the PyTorch backend uses. Skipped loudly without
megatron-core.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from gyre_proxy.engines.refengine import free_port
from gyre_train import InvalidConfigError
from gyre_train.backends import MegatronModelSpec, to_gpt2
from gyre_train.cells import SyntheticBatchConfig, synthetic_batch
from gyre_train.objective import packed_token_logprobs
from tests.integration.train_stream.gloo import gloo_world
from tests.real_servers import megatron_missing, require

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _megatron() -> None:
    require("megatron", megatron_missing())


SPEC = MegatronModelSpec(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=128, seed=9)
DATA = SyntheticBatchConfig(groups=1, executions=3, max_rows=2, vocab_size=128)


def _megatron(rank: int, port: int, output: str) -> None:
    from gyre_train.backends import MegatronBackend

    with gloo_world(rank, 1, port), MegatronBackend(SPEC) as backend:
        steps, _ = synthetic_batch(2, 0, DATA)
        logprobs = [backend.logprobs(s, grad=False) for s in steps]
        torch.save({"state": backend.full_named_tensors(), "logprobs": logprobs}, output)


def test_exported_gpt2_computes_megatrons_logprobs(tmp_path: Path) -> None:
    context = mp.start_processes(
        _megatron, args=(free_port(), str(tmp_path / "m.pt")), nprocs=1, join=False, start_method="spawn"
    )
    assert context is not None
    while not context.join(timeout=100):
        pass
    saved = torch.load(tmp_path / "m.pt")
    exported = to_gpt2(SPEC, saved["state"])
    folder = exported.save(tmp_path / "gpt2")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    steps, _ = synthetic_batch(2, 0, DATA)
    assert len(steps) >= 1 and any(len(s.row_starts) > 2 for s in steps)  # packed rows included
    with torch.no_grad():
        for step, expected in zip(steps, saved["logprobs"], strict=True):
            got = packed_token_logprobs(model, step)
            assert bool((expected != 0).any())
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_export_refuses_a_state_of_another_shape() -> None:
    state = {"embedding.word_embeddings.weight": torch.zeros(128, 32)}
    with pytest.raises(InvalidConfigError, match="no 'embedding\\.position_embeddings"):
        to_gpt2(SPEC, state)
