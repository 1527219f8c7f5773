"""Bytes for what crosses process boundaries during streaming training: micro-steps, batch
manifests, pass-1 shares and the clip of a batch.

msgpack (msgspec) envelopes with numpy arrays as raw little-endian bytes; decoding gives read-only
arrays and the same frozen types the pure code uses. Nothing here talks to Redis or torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt

from gyre_train.exceptions import InvalidLossInputError
from gyre_train.objective import ExecutionClip, ExecutionSummary
from gyre_train.trajectories import MicroStep, RowKey


class _MicroStepWire(msgspec.Struct, frozen=True, array_like=True):
    batch: int
    index: int
    closes_stream: bool
    rows: list[tuple[str, int]]
    execution_ids: list[str]
    execution_advantages: bytes  # float64 [E]
    token_ids: bytes  # int32 [T]
    position_ids: bytes  # int32 [T]
    row_starts: bytes  # int32 [R + 1]
    target_mask: bytes  # bool [T]
    behaviour_logprobs: bytes  # float32 [T]
    slots: bytes  # int32 [T]
    coefficients: bytes  # float64 [T]


def _le(array: npt.NDArray[np.generic], dtype: str) -> bytes:
    return np.ascontiguousarray(array, dtype=np.dtype(dtype)).tobytes()


def encode_micro_step(step: MicroStep) -> bytes:
    """One micro-step as msgpack bytes (arrays little-endian, no pickling)."""
    wire = _MicroStepWire(
        batch=step.batch,
        index=step.index,
        closes_stream=step.closes_stream,
        rows=[(r.execution_id, r.trajectory) for r in step.rows],
        execution_ids=list(step.execution_ids),
        execution_advantages=_le(step.execution_advantages, "<f8"),
        token_ids=_le(step.token_ids, "<i4"),
        position_ids=_le(step.position_ids, "<i4"),
        row_starts=_le(step.row_starts, "<i4"),
        target_mask=_le(step.target_mask, "|b1"),
        behaviour_logprobs=_le(step.behaviour_logprobs, "<f4"),
        slots=_le(step.slots, "<i4"),
        coefficients=_le(step.coefficients, "<f8"),
    )
    return msgspec.msgpack.encode(wire)


def decode_micro_step(data: bytes) -> MicroStep:
    """Inverse of `encode_micro_step`; raises InvalidLossInputError on bytes that are not one."""
    try:
        wire = msgspec.msgpack.decode(data, type=_MicroStepWire)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidLossInputError(f"not an encoded micro-step: {exc}") from exc
    return MicroStep(
        batch=wire.batch,
        index=wire.index,
        closes_stream=wire.closes_stream,
        rows=tuple(RowKey(e, t) for e, t in wire.rows),
        execution_ids=tuple(wire.execution_ids),
        execution_advantages=np.frombuffer(wire.execution_advantages, dtype="<f8").astype(np.float64),
        token_ids=np.frombuffer(wire.token_ids, dtype="<i4").astype(np.int32),
        position_ids=np.frombuffer(wire.position_ids, dtype="<i4").astype(np.int32),
        row_starts=np.frombuffer(wire.row_starts, dtype="<i4").astype(np.int32),
        target_mask=np.frombuffer(wire.target_mask, dtype="|b1").astype(np.bool_),
        behaviour_logprobs=np.frombuffer(wire.behaviour_logprobs, dtype="<f4").astype(np.float32),
        slots=np.frombuffer(wire.slots, dtype="<i4").astype(np.int32),
        coefficients=np.frombuffer(wire.coefficients, dtype="<f8").astype(np.float64),
    )


@dataclass(frozen=True, slots=True)
class ExecutionTotals:
    """What pass 1 needs of one execution of the batch (satisfies loss.ExecutionSummary)."""

    execution_id: str
    advantage: float
    target_count: int


class BatchManifest(msgspec.Struct, frozen=True, array_like=True):
    """The close marker of a batch: how many micro-steps were enqueued, and its executions."""

    batch: int
    micro_steps: int
    executions: list[tuple[str, float, int]]  # (id, A_i, L_i) of every execution, rows or not

    @classmethod
    def of(cls, batch: int, micro_steps: int, executions: Sequence[ExecutionSummary]) -> BatchManifest:
        return cls(batch, micro_steps, [(e.execution_id, e.advantage, e.target_count) for e in executions])

    def summaries(self) -> tuple[ExecutionTotals, ...]:
        return tuple(ExecutionTotals(e, a, n) for e, a, n in self.executions)

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> BatchManifest:
        return msgspec.msgpack.decode(data, type=cls)


class RatioShare(msgspec.Struct, frozen=True, array_like=True):
    """Pass 1 of one micro-step: per-execution sums of log rho_u and target counts."""

    index: int
    execution_ids: list[str]
    sums: list[float]
    counts: list[int]

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> RatioShare:
        return msgspec.msgpack.decode(data, type=cls)


class _ClipWire(msgspec.Struct, frozen=True, array_like=True):
    execution_ids: list[str]
    target_counts: list[int]
    sequence_ratios: bytes  # float64 [E]
    clip_mask: bytes  # float64 [E]


def encode_clip(clip: ExecutionClip) -> bytes:
    return msgspec.msgpack.encode(
        _ClipWire(
            list(clip.execution_ids),
            list(clip.target_counts),
            _le(clip.sequence_ratios, "<f8"),
            _le(clip.clip_mask, "<f8"),
        )
    )


def decode_clip(data: bytes) -> ExecutionClip:
    wire = msgspec.msgpack.decode(data, type=_ClipWire)
    return ExecutionClip(
        tuple(wire.execution_ids),
        tuple(wire.target_counts),
        np.frombuffer(wire.sequence_ratios, dtype="<f8").astype(np.float64),
        np.frombuffer(wire.clip_mask, dtype="<f8").astype(np.float64),
    )
