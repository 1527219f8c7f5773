"""The execution-level objective, paper equations (5) and (6), split so micro-steps sum exactly.

Pass 1 (no grad) sums log rho_u over all of an execution's targets, wherever they were packed,
and yields s_i and the clip mask m_i. Pass 2 is a per-micro-step loss whose per-token
coefficients 1/(L_i * B*N) make the micro-step losses (and gradients) add up to the batch loss.
It does not compute logprobs (see `logprobs.py`) and never recomputes behaviour logprobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from gyre_train.exceptions import InvalidConfigError, InvalidLossInputError

Float64Array = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class LossConfig:
    """Caps and the sequence-ratio clipping interval; defaults are the paper's."""

    token_ratio_cap: float = 5.0
    token_loss_cap: float = 100.0
    clip_low: float = 0.995
    clip_high: float = 1.005

    def __post_init__(self) -> None:
        if not 0 < self.clip_low <= 1 <= self.clip_high:
            raise InvalidConfigError(
                f"need 0 < clip_low <= 1 <= clip_high, got [{self.clip_low}, {self.clip_high}]"
            )
        if not (self.token_ratio_cap > 0 and self.token_loss_cap > 0):
            raise InvalidConfigError("token_ratio_cap and token_loss_cap must be positive")


class ExecutionSummary(Protocol):
    """What pass 1 needs of an execution (ExecutionRows satisfies it)."""

    @property
    def execution_id(self) -> str: ...
    @property
    def advantage(self) -> float: ...
    @property
    def target_count(self) -> int: ...


@dataclass(frozen=True, slots=True, eq=False)
class ExecutionClip:
    """Per-execution s_i (monitoring) and m_i (the one clip mask shared by its targets)."""

    execution_ids: tuple[str, ...]
    target_counts: tuple[int, ...]
    sequence_ratios: Float64Array  # [E]
    clip_mask: Float64Array  # [E] 0.0 or 1.0
    _slot: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.sequence_ratios.setflags(write=False)
        self.clip_mask.setflags(write=False)
        object.__setattr__(self, "_slot", {e: i for i, e in enumerate(self.execution_ids)})

    def mask_of(self, execution_ids: Sequence[str]) -> Float64Array:
        """m_i for each id; raises InvalidLossInputError for an id pass 1 did not see."""
        try:
            return self.clip_mask[[self._slot[e] for e in execution_ids]]
        except KeyError as exc:
            raise InvalidLossInputError(f"no sequence ratio for execution {exc.args[0]}") from exc

    @property
    def clip_fraction(self) -> float:
        """Share of executions with targets whose clip mask is 0."""
        live = np.array(self.target_counts) > 0
        return float((self.clip_mask[live] == 0).mean()) if live.any() else 0.0


def clip_executions(
    execution_ids: Sequence[str],
    log_ratio_sums: Sequence[float],
    target_counts: Sequence[int],
    advantages: Sequence[float],
    config: LossConfig,
) -> ExecutionClip:
    """s_i = exp(sum log rho / L_i) (eq. 5); m_i = 0 if (A>0, s>high) or (A<0, s<low), else 1."""
    sums = np.asarray(log_ratio_sums, dtype=np.float64)  # [E]
    counts = np.asarray(target_counts, dtype=np.int64)  # [E]
    adv = np.asarray(advantages, dtype=np.float64)  # [E]
    if not sums.shape == counts.shape == adv.shape == (len(execution_ids),):
        raise InvalidLossInputError("ids, log-ratio sums, target counts and advantages differ in length")
    ratios = np.exp(np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0))
    clipped = ((adv > 0) & (ratios > config.clip_high)) | ((adv < 0) & (ratios < config.clip_low))
    return ExecutionClip(tuple(execution_ids), tuple(counts.tolist()), ratios, np.where(clipped, 0.0, 1.0))


class SequenceRatioAccumulator:
    """Pass 1 state: per-execution sums of log rho_u and target counts, fed micro-step by micro-step.

    Merge accumulators of several cells with `merge`; `finish` checks that every target of every
    execution was seen exactly once before it computes s_i and m_i.
    """

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def add(
        self, execution_ids: Sequence[str], log_ratio_sums: Sequence[float], counts: Sequence[int]
    ) -> None:
        for execution_id, total, count in zip(execution_ids, log_ratio_sums, counts, strict=True):
            self._sums[execution_id] = self._sums.get(execution_id, 0.0) + float(total)
            self._counts[execution_id] = self._counts.get(execution_id, 0) + int(count)

    def merge(self, other: SequenceRatioAccumulator) -> None:
        self.add(list(other._sums), list(other._sums.values()), [other._counts[e] for e in other._sums])

    def finish(self, executions: Sequence[ExecutionSummary], config: LossConfig) -> ExecutionClip:
        for execution in executions:
            seen = self._counts.get(execution.execution_id, 0)
            # The packer may leave out every row of an execution whose advantage is 0 (its loss
            # and gradient are exactly 0): then pass 1 sees none of its targets, and only the
            # s_i monitor misses them.
            skipped = seen == 0 and execution.advantage == 0.0
            if seen != execution.target_count and not skipped:
                raise InvalidLossInputError(
                    f"execution {execution.execution_id}: pass 1 saw {seen} of {execution.target_count} targets"
                )
        return clip_executions(
            [e.execution_id for e in executions],
            [self._sums.get(e.execution_id, 0.0) for e in executions],
            [e.target_count for e in executions],
            [e.advantage for e in executions],
            config,
        )


def log_ratio_sums(
    logp_new: torch.Tensor, logp_roll: torch.Tensor, slots: torch.Tensor, num_slots: int
) -> torch.Tensor:
    """Per-slot sums of log rho_u = logp_theta - logp_roll, without gradient.

    logp_new, logp_roll: [U] float; slots: [U] int64 in 0..num_slots-1. Returns [num_slots] float64.
    """
    _check_same_shape(logp_new, logp_roll, slots)
    with torch.no_grad():
        log_ratio = logp_new.detach().double() - logp_roll.double()  # [U]
        out = torch.zeros(num_slots, dtype=torch.float64, device=logp_new.device)
        return out.index_add_(0, slots, log_ratio)  # [E]


@dataclass(frozen=True, slots=True)
class LossCounters:
    """Counts for the step log; add them over micro-steps."""

    target_tokens: int = 0
    token_ratio_cap_hits: int = 0
    loss_cap_hits: int = 0

    def __add__(self, other: LossCounters) -> LossCounters:
        return LossCounters(
            self.target_tokens + other.target_tokens,
            self.token_ratio_cap_hits + other.token_ratio_cap_hits,
            self.loss_cap_hits + other.loss_cap_hits,
        )


@dataclass(frozen=True, slots=True, eq=False)
class MicroStepLoss:
    """Pass 2 output: the differentiable loss share of one micro-step."""

    loss: torch.Tensor  # [] sum_u c_u * l_u
    token_losses: torch.Tensor  # [U] l_u before the 1/(L_i B N) coefficient
    counters: LossCounters


def token_loss(
    logp_new: torch.Tensor,
    logp_roll: torch.Tensor,
    advantages: torch.Tensor,
    clip_mask: torch.Tensor,
    coefficients: torch.Tensor,
    config: LossConfig,
) -> MicroStepLoss:
    """l_u = min(cap, -m_i * sg(min(rho_u, 5)) * A_i * logp_theta(y_u)); loss = sum_u c_u * l_u.

    All inputs are [U] over this micro-step's targets: logp_new carries the gradient, logp_roll is
    the recorded behaviour logprob, advantages/clip_mask/coefficients are the per-token copies of
    A_i, m_i and 1/(L_i * B*N). Raises InvalidLossInputError on mismatched shapes.
    """
    _check_same_shape(logp_new, logp_roll, advantages, clip_mask, coefficients)
    dtype = torch.promote_types(logp_new.dtype, torch.float32)
    logp = logp_new.to(dtype)  # [U]
    with torch.no_grad():
        ratio = torch.exp(logp.detach() - logp_roll.to(dtype))  # [U] rho_u
        ratio_bar = torch.clamp(ratio, max=config.token_ratio_cap)  # [U] sg(min(rho_u, cap))
        weight = clip_mask.to(dtype) * ratio_bar * advantages.to(dtype)  # [U]
    raw = -weight * logp  # [U]
    losses = torch.clamp(raw, max=config.token_loss_cap)  # [U] capped tokens get no gradient
    loss = (coefficients.to(dtype) * losses).sum()
    counters = LossCounters(
        target_tokens=int(logp.shape[0]),
        token_ratio_cap_hits=int((ratio > config.token_ratio_cap).sum()),
        loss_cap_hits=int((raw.detach() > config.token_loss_cap).sum()),
    )
    return MicroStepLoss(loss=loss, token_losses=losses, counters=counters)


@dataclass(frozen=True, slots=True)
class StepLog:
    """What one training step reports: sequence ratios, clip fraction and cap hits."""

    loss: float
    sequence_ratio_mean: float
    sequence_ratio_min: float
    sequence_ratio_max: float
    clip_fraction: float
    target_tokens: int
    token_ratio_cap_hits: int
    loss_cap_hits: int


def step_log(loss: float, clip: ExecutionClip, counters: LossCounters) -> StepLog:
    """Summarize a step; ratios are over executions with at least one target (NaN if none)."""
    live = np.array(clip.target_counts, dtype=np.int64) > 0
    ratios = clip.sequence_ratios[live]
    nan = math.nan
    return StepLog(
        loss=loss,
        sequence_ratio_mean=float(ratios.mean()) if ratios.size else nan,
        sequence_ratio_min=float(ratios.min()) if ratios.size else nan,
        sequence_ratio_max=float(ratios.max()) if ratios.size else nan,
        clip_fraction=clip.clip_fraction,
        target_tokens=counters.target_tokens,
        token_ratio_cap_hits=counters.token_ratio_cap_hits,
        loss_cap_hits=counters.loss_cap_hits,
    )


def _check_same_shape(*tensors: torch.Tensor) -> None:
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise InvalidLossInputError(f"expected [U] tensors of one length, got shapes {sorted(shapes)}")
