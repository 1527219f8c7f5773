"""The work of one micro-step in each pass, and the plain single-process loop over a batch.

Cells call `ratio_share` (pass 1) and `gradient_share` (pass 2) per claimed micro-step; the same
functions run back to back in `train_batch_locally`, the reference that streaming training must
equal and the baseline its benchmark measures against. No Redis, no processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gyre_train.backends import TrainingBackend
from gyre_train.cells.wire import RatioShare
from gyre_train.objective import (
    ExecutionClip,
    ExecutionSummary,
    LossConfig,
    SequenceRatioAccumulator,
    accumulate_sequence_ratios,
    micro_step_loss,
)
from gyre_train.trajectories import MicroStep


class _ShareRecorder(SequenceRatioAccumulator):
    """Catches the one `add` of a micro-step, so its pass-1 share can travel on its own."""

    share: tuple[list[str], list[float], list[int]] = ([], [], [])

    def add(
        self, execution_ids: Sequence[str], log_ratio_sums: Sequence[float], counts: Sequence[int]
    ) -> None:
        self.share = (list(execution_ids), [float(s) for s in log_ratio_sums], [int(c) for c in counts])


def ratio_share(backend: TrainingBackend, step: MicroStep) -> RatioShare:
    """Pass 1 of one micro-step: per-execution sums of log rho_u and target counts."""
    recorder = _ShareRecorder()
    accumulate_sequence_ratios(step, backend.logprobs(step, grad=False), recorder)
    ids, sums, counts = recorder.share
    return RatioShare(step.index, ids, sums, counts)


def merge_shares(
    shares: Iterable[RatioShare], executions: Sequence[ExecutionSummary], config: LossConfig
) -> ExecutionClip:
    """s_i and m_i of the batch from every micro-step's share (each exactly once)."""
    accumulator = SequenceRatioAccumulator()
    for share in shares:
        accumulator.add(share.execution_ids, share.sums, share.counts)
    return accumulator.finish(executions, config)


def gradient_share(
    backend: TrainingBackend, step: MicroStep, clip: ExecutionClip, config: LossConfig
) -> float:
    """Pass 2 of one micro-step: backward of its loss share into the replica's gradients.

    Returns the share's loss value (its contribution to the batch loss).
    """
    return backend.accumulate_gradients(
        step, lambda logprobs: micro_step_loss(step, logprobs, clip, config).loss
    )


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What one update reports."""

    loss: float
    grad_norm: float
    clip_fraction: float


def train_batch_locally(
    backend: TrainingBackend,
    steps: Sequence[MicroStep],
    executions: Sequence[ExecutionSummary],
    config: LossConfig,
) -> BatchResult:
    """One process, the whole batch: pass 1, pass 2 with accumulated gradients, one update."""
    clip = merge_shares((ratio_share(backend, s) for s in steps), executions, config)
    backend.zero_gradients()
    loss = sum(gradient_share(backend, s, clip, config) for s in steps)
    norm = backend.apply_update(backend.flat_gradients())
    return BatchResult(loss, norm, clip.clip_fraction)
