"""A tiny Qwen3 built from a config (no download): packing must not change logprobs, and one
optimizer step on the loss must move target logprobs in the direction of the advantage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gyre_train import BatchPacker, ExecutionRows, MicroStep, PackingConfig, ReadyGroup, TokenRow
from gyre_train.objective import (
    LossConfig,
    SequenceRatioAccumulator,
    accumulate_sequence_ratios,
    block_causal_mask,
    micro_step_loss,
    packed_token_logprobs,
)
from gyre_train.trajectories.testing import synthetic_rows

VOCAB = 97


def _model(attention: str) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        attn_implementation=attention,
    )
    return Qwen3ForCausalLM(config).eval()


def test_block_causal_mask_keeps_attention_inside_each_row() -> None:
    mask = block_causal_mask(np.array([0, 2, 5]), torch.float32, torch.device("cpu"))
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    assert mask.shape == (1, 1, 5, 5) and mask.min().item() == torch.finfo(torch.float32).min


def _row_logprobs(model: Qwen3ForCausalLM, row: TokenRow) -> torch.Tensor:
    ids = torch.tensor(row.token_ids, dtype=torch.long)[None]
    logits = model(input_ids=ids).logits[0, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return torch.cat([picked.new_zeros(1), picked])


def _pack(
    rows: tuple[TokenRow, ...], advantage: float, budget: int = 400
) -> tuple[BatchPacker, list[MicroStep]]:
    by_execution: dict[str, list[TokenRow]] = {}
    for row in rows:
        by_execution.setdefault(row.execution_id, []).append(row)
    executions = tuple(ExecutionRows(e, advantage, tuple(r)) for e, r in by_execution.items())
    config = PackingConfig(token_budget=budget, groups_per_batch=1, executions_per_group=len(executions))
    packer = BatchPacker(config, batch=0)
    return packer, packer.add_group(ReadyGroup("g", 0, executions))


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_logprobs_equal_per_row_logprobs(attention: str) -> None:
    model = _model(attention)
    rng = np.random.default_rng(0)
    rows = tuple(r for k in range(3) for r in synthetic_rows(rng, f"e{k}", 3, 30, 120, vocab_size=VOCAB))
    _, steps = _pack(rows, advantage=1.0)
    by_key = {(r.execution_id, r.trajectory): r for r in rows}
    with torch.no_grad():
        for step in steps:
            packed = packed_token_logprobs(model, step, targets_only=False)
            unmasked = model(input_ids=torch.tensor(step.token_ids, dtype=torch.long)[None]).logits
            for k, key in enumerate(step.rows):
                lo, hi = int(step.row_starts[k]), int(step.row_starts[k + 1])
                alone = _row_logprobs(model, by_key[(key.execution_id, key.trajectory)])
                torch.testing.assert_close(packed[lo:hi], alone, atol=1e-5, rtol=1e-5)
                if k > 0:  # without the block mask a later row would see the rows before it
                    assert not torch.allclose(unmasked[0, lo:hi], model(input_ids=torch.tensor(
                        step.token_ids[lo:hi], dtype=torch.long)[None]).logits[0], atol=1e-5)  # fmt: skip


def _target_logprob_sum(model: Qwen3ForCausalLM, steps: list[MicroStep]) -> float:
    with torch.no_grad():
        return sum(float(packed_token_logprobs(model, s)[torch.tensor(s.target_mask)].sum()) for s in steps)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_one_step_moves_target_logprobs_with_the_advantage(advantage: float) -> None:
    model = _model("sdpa")
    rng = np.random.default_rng(1)
    rows = synthetic_rows(rng, "e0", 4, 30, 100, vocab_size=VOCAB)
    # On-policy behaviour logprobs: the recorded values are the model's own, so s_i = 1 and m_i = 1.
    with torch.no_grad():
        rows = tuple(
            TokenRow(
                r.execution_id, r.trajectory, r.token_ids, r.target_mask, _row_logprobs(model, r).numpy()
            )
            for r in rows
        )
    packer, steps = _pack(rows, advantage, budget=max(len(r) for r in rows))
    assert len(steps) > 1  # the execution's weight must survive a split over micro-steps
    accumulator = SequenceRatioAccumulator()
    with torch.no_grad():
        for step in steps:
            accumulate_sequence_ratios(step, packed_token_logprobs(model, step), accumulator)
    clip = accumulator.finish(packer.executions, LossConfig())
    assert clip.clip_mask.tolist() == [1.0]
    assert abs(clip.sequence_ratios[0] - 1.0) < 1e-5
    before = _target_logprob_sum(model, steps)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    optimizer.zero_grad()
    for step in steps:
        micro_step_loss(step, packed_token_logprobs(model, step), clip, LossConfig()).loss.backward()
    optimizer.step()
    after = _target_logprob_sum(model, steps)
    assert (after - before) * advantage > 0


@pytest.mark.parametrize("chunk", [16, 1000])
def test_the_targets_only_head_equals_the_full_softmax_in_value_and_gradient(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gyre_train.objective import logprobs as module

    monkeypatch.setattr(module, "VOCAB_CHUNK", chunk)  # 16: many chunks; 1000: one
    model = _model("sdpa").train()
    rng = np.random.default_rng(1)
    rows = tuple(r for k in range(2) for r in synthetic_rows(rng, f"e{k}", 2, 20, 60, vocab_size=VOCAB))
    _, steps = _pack(rows, advantage=1.0)
    step = steps[0]
    targets = torch.tensor(step.target_mask)
    weights = torch.tensor(rng.normal(size=len(step)), dtype=torch.float32)  # [T] an arbitrary loss

    def value_and_grads(targets_only: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logprobs = packed_token_logprobs(model, step, targets_only=targets_only)
        (logprobs[targets] * weights[targets]).sum().backward()
        return logprobs[targets].detach(), [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]

    fast, fast_grads = value_and_grads(True)
    full, full_grads = value_and_grads(False)
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)
    for a, b in zip(fast_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert int(targets.sum()) > 0 and float(fast_grads[0].abs().sum()) > 0  # the head's gradient
    # Non-targets are left at 0: only targets feed the loss.
    with torch.no_grad():
        assert float(packed_token_logprobs(model, step)[~targets].abs().sum()) == 0.0
