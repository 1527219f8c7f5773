"""The execution-level objective (paper eqs. 5 and 6): pass 1 sums log ratios into s_i and the
clip mask m_i, pass 2 gives each packed micro-step its exact share of the batch loss.

Pure tensor math on packed micro-steps (`PackedStep`): no model (`gyre_train.backends`), no
optimizer, no reduction across cells (`gyre_train.cells`).
"""

from __future__ import annotations

from gyre_train.objective.logprobs import block_causal_mask, packed_token_logprobs
from gyre_train.objective.loss import (
    ExecutionClip,
    ExecutionSummary,
    LossConfig,
    LossCounters,
    MicroStepLoss,
    SequenceRatioAccumulator,
    StepLog,
    clip_executions,
    log_ratio_sums,
    step_log,
    token_loss,
)
from gyre_train.objective.packed import PackedStep, accumulate_sequence_ratios, micro_step_loss

__all__ = [
    "ExecutionClip",
    "ExecutionSummary",
    "LossConfig",
    "LossCounters",
    "MicroStepLoss",
    "PackedStep",
    "SequenceRatioAccumulator",
    "StepLog",
    "accumulate_sequence_ratios",
    "block_causal_mask",
    "clip_executions",
    "log_ratio_sums",
    "micro_step_loss",
    "packed_token_logprobs",
    "step_log",
    "token_loss",
]
