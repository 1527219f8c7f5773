from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_train import (
    BatchClosedError,
    BatchPacker,
    ExecutionRows,
    GroupTicket,
    InvalidConfigError,
    InvalidRowsError,
    MicroStep,
    PackingConfig,
    ReadyGroup,
    RowTooLongError,
    UnknownGroupError,
    select_oldest,
)
from gyre_train.objective import (
    LossConfig,
    SequenceRatioAccumulator,
    accumulate_sequence_ratios,
    micro_step_loss,
)
from gyre_train.trajectories.testing import InMemoryGroupSource, synthetic_group

N = 4


def _groups(seed: int, count: int, max_length: int = 200) -> list[ReadyGroup]:
    rng = np.random.default_rng(seed)
    return [
        synthetic_group(rng, f"g{k}", policy_version=int(rng.integers(0, 4)), executions=N, max_rows=3,
                        median_length=40, max_length=max_length)
        for k in range(count)
    ]  # fmt: skip


def _pack(groups: list[ReadyGroup], config: PackingConfig) -> tuple[BatchPacker, list[MicroStep]]:
    source = InMemoryGroupSource()
    for group in groups:
        source.put(group)
    packer = BatchPacker(config, batch=0)
    return packer, packer.pull(source)


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), budget=st.integers(200, 1200), groups=st.integers(1, 4))
def test_micro_steps_hold_every_row_once_within_budget(seed: int, budget: int, groups: int) -> None:
    config = PackingConfig(token_budget=budget, groups_per_batch=groups, executions_per_group=N)
    batch = _groups(seed, groups)
    packer, steps = _pack(batch, config)
    assert packer.closed
    assert [s.closes_stream for s in steps] == [False] * (len(steps) - 1) + [True]
    assert [s.index for s in steps] == list(range(len(steps)))
    wanted = {
        (r.execution_id, r.trajectory): r for g in batch for e in g.executions if e.advantage for r in e.rows
    }
    seen = []
    for step in steps:
        assert len(step) <= budget
        assert step.row_starts[0] == 0 and step.row_starts[-1] == len(step)
        for k, key in enumerate(step.rows):
            row = wanted[(key.execution_id, key.trajectory)]
            lo, hi = int(step.row_starts[k]), int(step.row_starts[k + 1])
            assert np.array_equal(step.token_ids[lo:hi], row.token_ids)
            assert np.array_equal(step.target_mask[lo:hi], row.target_mask)
            assert np.array_equal(step.behaviour_logprobs[lo:hi], row.behaviour_logprobs)
            assert step.position_ids[lo:hi].tolist() == list(range(hi - lo))
            assert {step.execution_ids[s] for s in step.slots[lo:hi]} == {key.execution_id}
            seen.append((key.execution_id, key.trajectory))
        assert np.all(step.coefficients[~step.target_mask] == 0)
    assert sorted(seen) == sorted(wanted)


def test_coefficients_are_one_over_l_i_times_b_n() -> None:
    config = PackingConfig(token_budget=300, groups_per_batch=2, executions_per_group=N)
    batch = _groups(5, 2)
    _, steps = _pack(batch, config)
    targets = {e.execution_id: e.target_count for g in batch for e in g.executions}
    for step in steps:
        for k in np.flatnonzero(step.target_mask):
            execution = step.execution_ids[step.slots[k]]
            assert step.coefficients[k] == pytest.approx(1.0 / (targets[execution] * 2 * N))


def test_groups_are_taken_oldest_policy_version_first_and_incrementally() -> None:
    groups = _groups(1, 3)
    versions = [5, 2, 2]
    groups = [ReadyGroup(g.group_id, v, g.executions) for g, v in zip(groups, versions, strict=True)]
    source = InMemoryGroupSource()
    packer = BatchPacker(PackingConfig(token_budget=400, groups_per_batch=2, executions_per_group=N), batch=3)
    assert packer.pull(source) == [] and not packer.closed
    source.put(groups[0])
    source.put(groups[1])
    packer.pull(source)
    assert [g.group_id for g in packer.groups] == ["g1", "g0"]
    assert packer.closed
    source.put(groups[2])
    assert packer.pull(source) == []
    with pytest.raises(BatchClosedError):
        packer.add_group(groups[2])
    assert select_oldest(
        [GroupTicket("x", 1, 9), GroupTicket("y", 1, 3), GroupTicket("z", 2, 0)]
    ) == GroupTicket("y", 1, 3)
    assert select_oldest([]) is None
    with pytest.raises(UnknownGroupError):
        source.take("nope")


def test_full_micro_steps_are_emitted_before_the_batch_closes() -> None:
    config = PackingConfig(
        token_budget=250, groups_per_batch=8, executions_per_group=N, max_open_micro_steps=2
    )
    packer = BatchPacker(config, batch=0)
    emitted = [packer.add_group(g) for g in _groups(2, 8)]
    assert sum(len(e) for e in emitted[:-1]) > 0
    assert not any(s.closes_stream for e in emitted[:-1] for s in e)
    assert emitted[-1][-1].closes_stream


def _batch_loss(
    steps: list[MicroStep], packer: BatchPacker, params: dict[tuple[str, int], torch.Tensor]
) -> torch.Tensor:
    """Pass 1 then pass 2 over micro-steps; logprobs come from per-row parameters."""

    def logprobs(step: MicroStep) -> torch.Tensor:
        parts = [params[(k.execution_id, k.trajectory)] for k in step.rows]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)

    accumulator = SequenceRatioAccumulator()
    executions = [e for e in packer.executions if e.advantage != 0.0]
    for step in steps:
        accumulate_sequence_ratios(step, logprobs(step), accumulator)
    clip = accumulator.finish(executions, LossConfig())
    return sum((micro_step_loss(s, logprobs(s), clip, LossConfig()).loss for s in steps), torch.zeros(()))


def _unpacked_loss(groups: list[ReadyGroup], params: dict[tuple[str, int], torch.Tensor]) -> torch.Tensor:
    """Equation (6) written row by row in torch, without micro-steps."""
    total = torch.zeros((), dtype=torch.float64)
    raw = N * len(groups)
    for execution in (e for g in groups for e in g.executions):
        if not execution.rows:
            continue
        new = torch.cat(
            [params[(r.execution_id, r.trajectory)][torch.tensor(r.target_mask)] for r in execution.rows]
        )
        roll = torch.cat(
            [torch.tensor(r.behaviour_logprobs[r.target_mask], dtype=torch.float64) for r in execution.rows]
        )
        a = execution.advantage
        s = torch.exp((new.detach() - roll).mean())
        m = 0.0 if (a > 0 and s > 1.005) or (a < 0 and s < 0.995) else 1.0
        rho = torch.clamp(torch.exp(new.detach() - roll), max=5.0)
        total = total + torch.clamp(-m * rho * a * new, max=100.0).sum() / (new.numel() * raw)
    return total  # fmt: skip


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32 - 1), budget=st.integers(200, 900), skip=st.booleans())
def test_loss_summed_over_micro_steps_equals_the_unpacked_batch_loss(
    seed: int, budget: int, skip: bool
) -> None:
    groups = _groups(seed, 3)
    rng = np.random.default_rng(seed)
    params = {}
    for row in (r for g in groups for e in g.executions for r in e.rows):
        drift = rng.normal(0, 0.01, size=len(row))
        params[(row.execution_id, row.trajectory)] = torch.tensor(
            np.minimum(row.behaviour_logprobs + drift, 0.0), dtype=torch.float64, requires_grad=True
        )
    config = PackingConfig(
        token_budget=budget, groups_per_batch=3, executions_per_group=N, skip_zero_advantage=skip
    )
    packer, steps = _pack(groups, config)
    packed = _batch_loss(steps, packer, params)
    packed_grads = torch.autograd.grad(packed, list(params.values()), allow_unused=True)
    unpacked = _unpacked_loss(groups, params)
    unpacked_grads = torch.autograd.grad(unpacked, list(params.values()), allow_unused=True)
    assert packed.item() == pytest.approx(unpacked.item(), rel=1e-9, abs=1e-15)
    for got, want in zip(packed_grads, unpacked_grads, strict=True):
        got_ = torch.zeros(1) if got is None else got
        want_ = torch.zeros(1) if want is None else want
        assert torch.allclose(got_.double(), want_.double(), rtol=1e-9, atol=1e-15)


def test_zero_advantage_rows_are_skipped_by_default() -> None:
    group = _groups(3, 1)[0]
    zeroed = ReadyGroup("z", 0, tuple(ExecutionRows(e.execution_id, 0.0, e.rows) for e in group.executions))
    _, steps = _pack([zeroed], PackingConfig(token_budget=500, groups_per_batch=1, executions_per_group=N))
    assert len(steps) == 1 and len(steps[0]) == 0 and steps[0].closes_stream
    _, kept = _pack(
        [zeroed],
        PackingConfig(
            token_budget=500, groups_per_batch=1, executions_per_group=N, skip_zero_advantage=False
        ),
    )
    assert sum(len(s.rows) for s in kept) == sum(len(e.rows) for e in zeroed.executions) > 0


def test_bad_groups_and_rows_are_refused() -> None:
    group = _groups(4, 1, max_length=300)[0]
    longest = max(len(r) for e in group.executions for r in e.rows)
    with pytest.raises(RowTooLongError, match=r"raise PackingConfig\.token_budget"):
        BatchPacker(
            PackingConfig(token_budget=longest - 1, groups_per_batch=1, executions_per_group=N), 0
        ).add_group(group)
    with pytest.raises(InvalidRowsError, match="expected N"):
        BatchPacker(
            PackingConfig(token_budget=1000, groups_per_batch=1, executions_per_group=N + 1), 0
        ).add_group(group)
    packer = BatchPacker(PackingConfig(token_budget=1000, groups_per_batch=2, executions_per_group=N), 0)
    packer.add_group(group)
    with pytest.raises(InvalidRowsError, match="already in batch"):
        packer.add_group(group)
    with pytest.raises(InvalidConfigError):
        PackingConfig(token_budget=0, groups_per_batch=1, executions_per_group=1)


def test_a_group_with_a_row_over_the_budget_is_refused_whole_and_changes_nothing() -> None:
    """Rows longer than the micro-step budget are never split nor silently dropped: the group
    holding one is refused with RowTooLongError, and the packer goes on as if it never came."""
    short, other, long_ = _groups(7, 3, max_length=150)
    budget = 150
    k = next(i for i, e in enumerate(long_.executions) if e.rows)
    stretched = long_.executions[k]
    mask = np.arange(budget + 1) > 0
    grown = dataclasses.replace(stretched.rows[0], token_ids=np.zeros(budget + 1, np.int32), target_mask=mask,
                                behaviour_logprobs=np.where(mask, -0.5, 0.0).astype(np.float32))  # fmt: skip
    executions = list(long_.executions)
    executions[k] = dataclasses.replace(stretched, rows=(grown, *stretched.rows[1:]))
    long_ = dataclasses.replace(long_, executions=tuple(executions))
    packer = BatchPacker(PackingConfig(token_budget=budget, groups_per_batch=2, executions_per_group=N), 0)
    first = packer.add_group(short)
    with pytest.raises(
        RowTooLongError, match=rf"has {budget + 1} tokens, token_budget is {budget}; group g2"
    ):
        packer.add_group(long_)
    assert packer.groups == (short,) and not packer.closed
    steps = first + packer.add_group(other)
    assert packer.closed and steps[-1].closes_stream
    packed = [(k.execution_id, k.trajectory) for s in steps for k in s.rows]
    wanted = [(r.execution_id, r.trajectory) for g in (short, other) for e in g.executions if e.advantage
              for r in e.rows]  # fmt: skip
    assert sorted(packed) == sorted(wanted)
    # A group naming one execution twice is refused the same way, before anything is taken.
    twice = dataclasses.replace(
        other, group_id="g9", executions=(*other.executions[:-1], other.executions[0])
    )
    fresh = BatchPacker(PackingConfig(token_budget=budget, groups_per_batch=1, executions_per_group=N), 0)
    with pytest.raises(InvalidRowsError, match="already in batch"):
        fresh.add_group(twice)
    assert fresh.add_group(other)[-1].closes_stream
