from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_train import InvalidConfigError, InvalidLossInputError, execution_coefficient
from gyre_train.objective import (
    LossConfig,
    LossCounters,
    SequenceRatioAccumulator,
    clip_executions,
    log_ratio_sums,
    step_log,
    token_loss,
)

CONFIG = LossConfig()
F64 = npt.NDArray[np.float64]


def reference(
    owner: npt.NDArray[np.int64], logp_new: F64, logp_roll: F64, adv: F64, raw_executions: int
) -> tuple[float, F64, F64]:
    """Equations (5) and (6) evaluated directly in float64: loss, d loss / d logp_new, per-execution loss."""
    loss, grad = 0.0, np.zeros_like(logp_new)
    per_execution = np.zeros(len(adv))
    for i, a in enumerate(adv):
        idx = np.flatnonzero(owner == i)
        if idx.size == 0:
            continue
        s = math.exp(float(np.mean(logp_new[idx] - logp_roll[idx])))
        m = 0.0 if (a > 0 and s > 1.005) or (a < 0 and s < 0.995) else 1.0
        rho_bar = np.minimum(np.exp(logp_new[idx] - logp_roll[idx]), 5.0)
        raw = -m * rho_bar * a * logp_new[idx]
        weight = 1.0 / (idx.size * raw_executions)
        per_execution[i] = float(np.minimum(100.0, raw).sum()) * weight
        grad[idx] = np.where(raw < 100.0, -m * rho_bar * a, 0.0) * weight
    loss = float(per_execution.sum())
    return loss, grad, per_execution


def split_loss(
    owner: npt.NDArray[np.int64],
    logp_new: torch.Tensor,
    logp_roll: F64,
    adv: F64,
    raw_executions: int,
    steps: list[npt.NDArray[np.int64]],
) -> tuple[torch.Tensor, F64, LossCounters]:
    """The library's two passes over micro-steps (each a list of token indices)."""
    num = len(adv)
    accumulator = SequenceRatioAccumulator()
    for step in steps:
        index = torch.as_tensor(step)
        slots = torch.as_tensor(owner[step])
        sums = log_ratio_sums(logp_new[index], torch.as_tensor(logp_roll[step]), slots, num)
        accumulator.add([f"e{i}" for i in range(num)], sums.tolist(), np.bincount(owner[step], minlength=num))
    counts = np.bincount(owner, minlength=num)
    summaries = [
        _Summary(f"e{i}", float(a), int(c)) for i, (a, c) in enumerate(zip(adv, counts, strict=True))
    ]
    clip = accumulator.finish(summaries, CONFIG)
    total = torch.zeros((), dtype=torch.float64)
    per_execution = np.zeros(num)
    counters = LossCounters()
    coefficient = np.array([execution_coefficient(int(c), raw_executions) for c in counts])
    for step in steps:
        s = torch.as_tensor(step)
        out = token_loss(
            logp_new[s],
            torch.as_tensor(logp_roll[step]),
            torch.as_tensor(adv[owner[step]]),
            torch.as_tensor(clip.clip_mask[owner[step]]),
            torch.as_tensor(coefficient[owner[step]]),
            CONFIG,
        )
        total = total + out.loss
        counters = counters + out.counters
        np.add.at(per_execution, owner[step], (out.token_losses.detach().numpy() * coefficient[owner[step]]))
    return total, per_execution, counters


class _Summary:
    """Satisfies loss.ExecutionSummary without token rows."""

    def __init__(self, execution_id: str, advantage: float, target_count: int) -> None:
        self.execution_id = execution_id
        self.advantage = advantage
        self.target_count = target_count


@st.composite
def batches(draw: st.DrawFn) -> tuple[npt.NDArray[np.int64], F64, F64, F64, int, np.random.Generator]:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    num = draw(st.integers(1, 6))
    sizes = rng.integers(0, 12, size=num)
    owner = np.repeat(np.arange(num), sizes)
    rng.shuffle(owner)
    spread = draw(st.sampled_from([0.001, 0.01, 0.1, 2.0]))
    logp_new = -rng.exponential(draw(st.sampled_from([0.5, 5.0, 30.0])), size=owner.size)
    logp_roll = np.minimum(logp_new - rng.normal(0, spread, size=owner.size), 0.0)
    adv = rng.normal(0, draw(st.sampled_from([0.5, 3.0])), size=num) * (rng.random(num) > 0.2)
    raw_executions = num + int(rng.integers(0, 4))
    return owner, logp_new, logp_roll, adv, raw_executions, rng


def random_steps(rng: np.random.Generator, size: int) -> list[npt.NDArray[np.int64]]:
    order = rng.permutation(size)
    cuts = np.sort(rng.integers(0, size + 1, size=int(rng.integers(0, 5))))
    return [part for part in np.split(order, cuts)]


@settings(max_examples=120)
@given(batch=batches())
def test_loss_and_gradient_match_the_formulas(
    batch: tuple[npt.NDArray[np.int64], F64, F64, F64, int, np.random.Generator],
) -> None:
    owner, logp_new, logp_roll, adv, raw_executions, rng = batch
    expected_loss, expected_grad, expected_per_execution = reference(
        owner, logp_new, logp_roll, adv, raw_executions
    )
    theta = torch.tensor(logp_new, requires_grad=True)
    loss, per_execution, _ = split_loss(
        owner, theta, logp_roll, adv, raw_executions, random_steps(rng, owner.size)
    )
    loss.backward()
    assert theta.grad is not None
    assert loss.item() == pytest.approx(expected_loss, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(theta.grad.numpy(), expected_grad, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(per_execution, expected_per_execution, rtol=1e-9, atol=1e-15)


@settings(max_examples=80)
@given(batch=batches())
def test_assignment_and_order_of_trajectories_and_micro_steps_do_not_matter(
    batch: tuple[npt.NDArray[np.int64], F64, F64, F64, int, np.random.Generator],
) -> None:
    owner, logp_new, logp_roll, adv, raw_executions, rng = batch
    # Trajectories: a random partition of each execution's targets; a shared target can be carried
    # by any of them, so reassigning one and reordering everything must leave the loss alone.
    trajectory = rng.integers(0, 3, size=owner.size)

    def run(assign: npt.NDArray[np.int64], order_seed: int) -> tuple[float, F64, F64]:
        order_rng = np.random.default_rng(order_seed)
        rows = [np.flatnonzero((owner == i) & (assign == t)) for i in range(len(adv)) for t in range(3)]
        rows = [rows[k] for k in order_rng.permutation(len(rows))]
        tokens = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
        cuts = np.sort(order_rng.integers(0, tokens.size + 1, size=3))
        theta = torch.tensor(logp_new, requires_grad=True)
        loss, per_execution, _ = split_loss(
            owner, theta, logp_roll, adv, raw_executions, np.split(tokens, cuts)
        )
        loss.backward()
        assert theta.grad is not None
        return loss.item(), theta.grad.numpy().copy(), per_execution

    base = run(trajectory, 0)
    moved = trajectory.copy()
    if moved.size:
        moved[int(rng.integers(0, moved.size))] = int(rng.integers(0, 3))
    for variant in (run(moved, 1), run(trajectory, 2)):
        assert variant[0] == pytest.approx(base[0], rel=1e-12, abs=1e-15)
        np.testing.assert_allclose(variant[1], base[1], rtol=1e-12, atol=1e-18)
        np.testing.assert_allclose(variant[2], base[2], rtol=1e-12, atol=1e-18)


def _single(
    logp_new: list[float], logp_roll: list[float], advantage: float
) -> tuple[torch.Tensor, torch.Tensor]:
    owner = np.zeros(len(logp_new), dtype=np.int64)
    theta = torch.tensor(logp_new, dtype=torch.float64, requires_grad=True)
    steps = [np.arange(len(logp_new))]
    loss, _, _ = split_loss(owner, theta, np.array(logp_roll), np.array([advantage]), 1, steps)
    loss.backward()
    assert theta.grad is not None
    return loss.detach(), theta.grad


def test_execution_without_targets_contributes_zero() -> None:
    assert execution_coefficient(0, 8) == 0.0
    clip = clip_executions(["a"], [0.0], [0], [2.0], CONFIG)
    assert clip.sequence_ratios.tolist() == [1.0] and clip.clip_mask.tolist() == [1.0]
    owner = np.array([0, 0, 0])
    theta = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    roll = np.array([-1.0, -2.0, -0.5])
    with_empty, per_execution, _ = split_loss(owner, theta, roll, np.array([1.0, 3.0]), 4, [np.arange(3)])
    assert per_execution[1] == 0.0
    without, _, _ = split_loss(owner, theta, roll, np.array([1.0]), 4, [np.arange(3)])
    assert with_empty.item() == pytest.approx(without.item())


def test_token_ratio_cap_weights_at_five_and_is_counted() -> None:
    # log ratios +2 and -2 average to 0: s = 1, no clip; the first token's ratio e^2 is capped at 5.
    theta = torch.tensor([-1.0, -3.0], dtype=torch.float64, requires_grad=True)
    out = token_loss(
        theta,
        torch.tensor([-3.0, -1.0], dtype=torch.float64),
        torch.tensor([1.0, 1.0], dtype=torch.float64),
        torch.ones(2, dtype=torch.float64),
        torch.full((2,), 0.5, dtype=torch.float64),
        CONFIG,
    )
    assert out.counters == LossCounters(target_tokens=2, token_ratio_cap_hits=1, loss_cap_hits=0)
    assert out.token_losses.tolist() == pytest.approx([5.0 * 1.0, math.exp(-2.0) * 3.0])
    out.loss.backward()
    assert theta.grad is not None
    assert theta.grad.tolist() == pytest.approx([-5.0 * 0.5, -math.exp(-2.0) * 0.5])


def test_token_loss_cap_stops_the_gradient() -> None:
    loss, grad = _single([-20.0, -0.1], [-20.0, -0.1], advantage=10.0)
    assert loss.item() == pytest.approx((100.0 + 1.0) / 2)
    assert grad.tolist() == pytest.approx([0.0, -10.0 / 2])
    theta = torch.tensor([-20.0], dtype=torch.float64)
    ones = torch.ones(1, dtype=torch.float64)
    assert token_loss(theta, theta, ones * 10, ones, ones, CONFIG).counters.loss_cap_hits == 1


@pytest.mark.parametrize(
    ("shift", "advantage", "clipped"),
    [(0.01, 1.0, True), (-0.01, -1.0, True), (-0.01, 1.0, False), (0.01, -1.0, False), (0.004, 1.0, False)],
)
def test_sequence_ratio_clip_mask(shift: float, advantage: float, clipped: bool) -> None:
    # Every token's log ratio is `shift`, so s = exp(shift).
    loss, grad = _single([-1.0, -2.0], [-1.0 - shift, -2.0 - shift], advantage)
    assert (loss.item() == 0.0) == clipped
    assert (not grad.any().item()) == clipped


def test_accumulator_refuses_missing_targets_and_merges() -> None:
    first, second = SequenceRatioAccumulator(), SequenceRatioAccumulator()
    first.add(["a"], [0.02], [1])
    second.add(["a", "b"], [0.0, -0.5], [1, 2])
    summaries = [_Summary("a", 1.0, 2), _Summary("b", -1.0, 2)]
    with pytest.raises(InvalidLossInputError, match="saw 1 of 2"):
        first.finish(summaries, CONFIG)
    first.merge(second)
    clip = first.finish(summaries, CONFIG)
    assert clip.sequence_ratios.tolist() == pytest.approx([math.exp(0.01), math.exp(-0.25)])
    assert clip.clip_mask.tolist() == [0.0, 0.0]
    assert clip.clip_fraction == 1.0
    assert clip.mask_of(["b", "a"]).tolist() == [0.0, 0.0]
    with pytest.raises(InvalidLossInputError, match="no sequence ratio"):
        clip.mask_of(["c"])


def test_step_log_summarizes() -> None:
    clip = clip_executions(["a", "b", "c"], [0.1, 0.0, 0.0], [10, 5, 0], [1.0, 1.0, 0.0], CONFIG)
    log = step_log(0.5, clip, LossCounters(15, 2, 1))
    assert log.sequence_ratio_max == pytest.approx(math.exp(0.01))
    assert log.sequence_ratio_min == 1.0
    assert log.clip_fraction == 0.5
    assert (log.target_tokens, log.token_ratio_cap_hits, log.loss_cap_hits) == (15, 2, 1)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(InvalidConfigError):
        LossConfig(clip_low=1.01)
    with pytest.raises(InvalidConfigError):
        LossConfig(token_ratio_cap=0.0)
    with pytest.raises(InvalidLossInputError):
        execution_coefficient(3, 0)
    x = torch.zeros(3)
    with pytest.raises(InvalidLossInputError, match="one length"):
        token_loss(x, x, x, x, torch.zeros(2), CONFIG)
    with pytest.raises(InvalidLossInputError):
        clip_executions(["a"], [0.0, 1.0], [1], [1.0], CONFIG)


def test_an_execution_the_packer_skipped_for_a_zero_advantage_needs_no_pass_1_targets() -> None:
    accumulator = SequenceRatioAccumulator()
    accumulator.add(["a"], [0.0], [2])
    skipped = [_Summary("a", 1.0, 2), _Summary("z", 0.0, 3)]  # z: A = 0, none of its rows packed
    clip = accumulator.finish(skipped, CONFIG)
    assert clip.mask_of(["z"]).tolist() == [1.0]
    # A nonzero advantage with no targets seen is still a missing micro-step.
    with pytest.raises(InvalidLossInputError, match="saw 0 of 3"):
        accumulator.finish([_Summary("a", 1.0, 2), _Summary("n", -1.0, 3)], CONFIG)
