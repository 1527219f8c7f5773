"""The loss of packed micro-steps: pass 1 and pass 2 of `loss.py` fed from micro-step arrays.

Given the policy's per-token logprobs of a micro-step (from `logprobs.py` or any backend), this
selects the targets and gathers A_i, m_i and 1/(L_i * B*N) per token. A micro-step is anything
shaped like `PackedStep` (the packer's `MicroStep` is one), so the objective sits below the
packer. It holds no model, no optimizer and no cross-cell reduction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from gyre_train.exceptions import InvalidLossInputError
from gyre_train.objective.loss import (
    ExecutionClip,
    LossConfig,
    MicroStepLoss,
    SequenceRatioAccumulator,
    log_ratio_sums,
    token_loss,
)


class PackedStep(Protocol):
    """Rows packed into one micro-step, as the objective reads them (see `MicroStep`)."""

    @property
    def execution_ids(self) -> Sequence[str]: ...  # [E] executions present

    @property
    def execution_advantages(self) -> npt.NDArray[np.float64]: ...  # [E] A_i

    @property
    def token_ids(self) -> npt.NDArray[np.int32]: ...  # [T]

    @property
    def position_ids(self) -> npt.NDArray[np.int32]: ...  # [T], restarting at 0 on every row

    @property
    def row_starts(self) -> npt.NDArray[np.int32]: ...  # [R + 1] row boundaries

    @property
    def target_mask(self) -> npt.NDArray[np.bool_]: ...  # [T]

    @property
    def behaviour_logprobs(self) -> npt.NDArray[np.float32]: ...  # [T], 0 at non-targets

    @property
    def slots(self) -> npt.NDArray[np.int32]: ...  # [T] index into execution_ids

    @property
    def coefficients(self) -> npt.NDArray[np.float64]: ...  # [T] 1/(L_i * B*N) at targets

    def __len__(self) -> int: ...  # T


def _targets(step: PackedStep, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if tuple(logprobs.shape) != (len(step),):
        raise InvalidLossInputError(
            f"logprobs has shape {tuple(logprobs.shape)}, micro-step has {len(step)} tokens"
        )
    mask = torch.tensor(step.target_mask, device=logprobs.device)  # [T]
    logp_new = logprobs[mask]  # [U]
    logp_roll = torch.tensor(step.behaviour_logprobs, device=logprobs.device)[mask]  # [U]
    slots = torch.tensor(step.slots, dtype=torch.long, device=logprobs.device)[mask]  # [U]
    return logp_new, logp_roll, slots


def accumulate_sequence_ratios(
    step: PackedStep, logprobs: torch.Tensor, accumulator: SequenceRatioAccumulator
) -> None:
    """Pass 1: add this micro-step's per-execution sums of log rho_u (no gradient)."""
    logp_new, logp_roll, slots = _targets(step, logprobs.detach())
    sums = log_ratio_sums(logp_new, logp_roll, slots, len(step.execution_ids))  # [E]
    counts = torch.bincount(slots, minlength=len(step.execution_ids))  # [E]
    accumulator.add(step.execution_ids, sums.tolist(), counts.tolist())


def micro_step_loss(
    step: PackedStep, logprobs: torch.Tensor, clip: ExecutionClip, config: LossConfig
) -> MicroStepLoss:
    """Pass 2: this micro-step's share of the batch loss; backward() on each share and sum grads.

    logprobs: [T] from the current policy, with gradient. Raises InvalidLossInputError when the
    shape is wrong or `clip` lacks an execution of the micro-step.
    """
    logp_new, logp_roll, slots = _targets(step, logprobs)
    device = logprobs.device
    per_slot_mask = torch.tensor(clip.mask_of(step.execution_ids), device=device)  # [E]
    advantages = torch.tensor(step.execution_advantages, device=device)[slots]  # [U]
    coefficients = torch.tensor(step.coefficients[step.target_mask], device=device)  # [U]
    return token_loss(logp_new, logp_roll, advantages, per_slot_mask[slots], coefficients, config)
