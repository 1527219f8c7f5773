"""The loss of packed micro-steps: pass 1 and pass 2 of `loss.py` fed from MicroStep arrays.

Given the policy's per-token logprobs of a micro-step (from `logprobs.py` or any backend), this
selects the targets and gathers A_i, m_i and 1/(L_i * B*N) per token. It holds no model, no
optimizer and no cross-cell reduction (merge SequenceRatioAccumulator instances for that).
"""

from __future__ import annotations

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
from gyre_train.trajectories.packing import MicroStep


def _targets(step: MicroStep, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    step: MicroStep, logprobs: torch.Tensor, accumulator: SequenceRatioAccumulator
) -> None:
    """Pass 1: add this micro-step's per-execution sums of log rho_u (no gradient)."""
    logp_new, logp_roll, slots = _targets(step, logprobs.detach())
    sums = log_ratio_sums(logp_new, logp_roll, slots, len(step.execution_ids))  # [E]
    counts = torch.bincount(slots, minlength=len(step.execution_ids))  # [E]
    accumulator.add(step.execution_ids, sums.tolist(), counts.tolist())


def micro_step_loss(
    step: MicroStep, logprobs: torch.Tensor, clip: ExecutionClip, config: LossConfig
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
