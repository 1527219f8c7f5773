"""The pure part of the stream packing buffer: ready groups in, packed micro-steps out.

Groups are taken oldest policy version first, one at a time, until the batch has B; each group's
rows go into open micro-steps by first-fit decreasing, full micro-steps are emitted at once, and
the batch's last micro-step closes the stream. Per-token coefficients 1/(L_i * B*N) ride along so
any split over micro-steps sums to the batch loss. The Redis queue and the database are not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from gyre_train.exceptions import (
    BatchClosedError,
    InvalidConfigError,
    InvalidLossInputError,
    InvalidRowsError,
    RowTooLongError,
)
from gyre_train.trajectories.rows import ExecutionRows, TokenRow
from gyre_train.trajectories.trajectory import BoolArray, Float32Array, Int32Array

Float64Array = npt.NDArray[np.float64]
_Scalar = TypeVar("_Scalar", bound=np.generic)


def execution_coefficient(target_count: int, raw_executions: int) -> float:
    """The weight 1 / (L_i * B*N) of every target of an execution; 0 when L_i = 0 (eq. 6)."""
    if raw_executions < 1 or target_count < 0:
        raise InvalidLossInputError(f"L_i={target_count}, B*N={raw_executions}")
    return 0.0 if target_count == 0 else 1.0 / (target_count * raw_executions)


@dataclass(frozen=True, slots=True)
class PackingConfig:
    """Micro-step size in tokens, B and N, and how many micro-steps may stay open for filling.

    A row longer than `token_budget` is refused (RowTooLongError), never split nor dropped: a
    trajectory row must keep its full context, so the budget must be at least the longest context
    an engine accepts. With `skip_zero_advantage`, rows of executions with A_i = 0 are not
    packed: their loss and gradient are exactly 0, only the s_i monitor loses them.
    """

    token_budget: int
    groups_per_batch: int
    executions_per_group: int
    max_open_micro_steps: int = 4
    skip_zero_advantage: bool = True

    def __post_init__(self) -> None:
        for name in ("token_budget", "groups_per_batch", "executions_per_group", "max_open_micro_steps"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def raw_executions(self) -> int:
        """B*N, the denominator of the batch loss."""
        return self.groups_per_batch * self.executions_per_group


@dataclass(frozen=True, slots=True)
class GroupTicket:
    """A ready, unclaimed group as the trajectory buffer lists it (cheap: no tokens)."""

    group_id: str
    policy_version: int  # v_d, the version published when the group was dispatched
    ready_seq: int  # order in which groups became ready; breaks ties between equal versions


@dataclass(frozen=True, slots=True)
class ReadyGroup:
    """All N executions of one group with their rows (placeholders and excluded ones have none)."""

    group_id: str
    policy_version: int
    executions: tuple[ExecutionRows, ...]


class ReadyGroupSource(Protocol):
    """The trajectory buffer as the packer sees it (in memory: `testing.InMemoryGroupSource`)."""

    def ready_groups(self) -> Sequence[GroupTicket]: ...

    def take(self, group_id: str) -> ReadyGroup: ...


def select_oldest(tickets: Sequence[GroupTicket]) -> GroupTicket | None:
    """The ticket with the oldest policy version, then the earliest ready; None if empty."""
    return min(tickets, key=lambda t: (t.policy_version, t.ready_seq, t.group_id), default=None)


@dataclass(frozen=True, slots=True)
class RowKey:
    """Which trajectory a packed row came from."""

    execution_id: str
    trajectory: int


@dataclass(frozen=True, slots=True, eq=False)
class MicroStep:
    """Packed rows of one micro-step, concatenated with no padding (T <= token_budget).

    Position ids restart at 0 on every row and `row_starts` holds the boundaries, so attention must
    not cross rows. `slots[k]` indexes `execution_ids` for token k's row; `coefficients` is
    1/(L_i * B*N) at targets and 0 elsewhere.
    """

    batch: int
    index: int  # order within the batch
    closes_stream: bool
    rows: tuple[RowKey, ...]
    execution_ids: tuple[str, ...]  # [E] executions present in this micro-step
    execution_advantages: Float64Array  # [E]
    token_ids: Int32Array  # [T]
    position_ids: Int32Array  # [T]
    row_starts: Int32Array  # [R + 1], cu_seqlens style
    target_mask: BoolArray  # [T]
    behaviour_logprobs: Float32Array  # [T], 0 at non-targets
    slots: Int32Array  # [T]
    coefficients: Float64Array  # [T]

    def __post_init__(self) -> None:
        for name in ("execution_advantages", "token_ids", "position_ids", "row_starts", "target_mask",
                     "behaviour_logprobs", "slots", "coefficients"):  # fmt: skip
            getattr(self, name).setflags(write=False)

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def advantages(self) -> Float64Array:
        """[T] A_i of each token's execution."""
        return self.execution_advantages[self.slots]


@dataclass(slots=True)
class _OpenStep:
    rows: list[TokenRow] = field(default_factory=list)
    used: int = 0


class BatchPacker:
    """Packs the B groups of one batch, incrementally; one instance per batch.

    Call `pull(source)` whenever groups may have become ready (or `add_group` directly); each call
    returns the micro-steps completed so far. After the B-th group every remaining micro-step is
    emitted and the last one has `closes_stream` set (an empty one if the batch had no rows).
    """

    def __init__(self, config: PackingConfig, batch: int) -> None:
        self._config = config
        self._batch = batch
        self._open: list[_OpenStep] = []
        self._groups: list[ReadyGroup] = []
        self._coefficient: dict[str, float] = {}
        self._advantage: dict[str, float] = {}
        self._emitted = 0

    @property
    def closed(self) -> bool:
        return len(self._groups) == self._config.groups_per_batch

    @property
    def groups(self) -> tuple[ReadyGroup, ...]:
        return tuple(self._groups)

    @property
    def executions(self) -> tuple[ExecutionRows, ...]:
        """Every execution taken so far, rows included (what pass 1 must cover)."""
        return tuple(e for g in self._groups for e in g.executions)

    def pull(self, source: ReadyGroupSource) -> list[MicroStep]:
        """Take ready groups oldest first until the batch is full or none is ready."""
        emitted: list[MicroStep] = []
        while not self.closed:
            ticket = select_oldest(source.ready_groups())
            if ticket is None:
                break
            emitted.extend(self.add_group(source.take(ticket.group_id)))
        return emitted

    def add_group(self, group: ReadyGroup) -> list[MicroStep]:
        """Pack one group; raises RowTooLongError, InvalidRowsError or BatchClosedError."""
        if self.closed:
            raise BatchClosedError(f"batch {self._batch} already has {self._config.groups_per_batch} groups")
        if len(group.executions) != self._config.executions_per_group:
            raise InvalidRowsError(
                f"group {group.group_id} has {len(group.executions)} executions, "
                f"expected N={self._config.executions_per_group}"
            )
        # Everything is checked before anything changes: a refused group leaves the packer as it was.
        seen: set[str] = set()
        for execution in group.executions:
            if execution.execution_id in self._coefficient or execution.execution_id in seen:
                raise InvalidRowsError(
                    f"execution {execution.execution_id} is already in batch {self._batch}"
                )
            seen.add(execution.execution_id)
        rows = [
            row
            for execution in group.executions
            if not (self._config.skip_zero_advantage and execution.advantage == 0.0)
            for row in execution.rows
        ]
        budget = self._config.token_budget
        for row in rows:
            if len(row) > budget:
                raise RowTooLongError(
                    f"row {row.execution_id}/{row.trajectory} has {len(row)} tokens, token_budget is {budget}; "
                    f"group {group.group_id} is not packed"
                )
        coefficients = {
            e.execution_id: execution_coefficient(e.target_count, self._config.raw_executions)
            for e in group.executions
        }
        self._coefficient.update(coefficients)
        self._advantage.update({e.execution_id: e.advantage for e in group.executions})
        self._groups.append(group)
        # First-fit decreasing over this group's rows; ties broken by id so packing is deterministic.
        for row in sorted(rows, key=lambda r: (-len(r), r.execution_id, r.trajectory)):
            step = next((s for s in self._open if s.used + len(row) <= budget), None)
            if step is None:
                step = _OpenStep()
                self._open.append(step)
            step.rows.append(row)
            step.used += len(row)
        emitted: list[MicroStep] = []
        if self.closed:
            remaining = sorted(self._open, key=lambda s: -s.used) or [_OpenStep()]
            self._open = []
            for i, step in enumerate(remaining):
                emitted.append(self._emit(step, closes=i == len(remaining) - 1))
            return emitted
        full = [s for s in self._open if s.used == budget]
        self._open = [s for s in self._open if s.used < budget]
        while len(self._open) > self._config.max_open_micro_steps:
            fullest = max(self._open, key=lambda s: s.used)
            self._open.remove(fullest)
            full.append(fullest)
        return [self._emit(step, closes=False) for step in full]

    def _emit(self, step: _OpenStep, closes: bool) -> MicroStep:
        execution_ids = tuple(dict.fromkeys(r.execution_id for r in step.rows))
        slot_of = {e: i for i, e in enumerate(execution_ids)}
        lengths = np.array([len(r) for r in step.rows], dtype=np.int32)  # [R]
        row_starts = np.zeros(len(step.rows) + 1, dtype=np.int32)  # [R + 1]
        np.cumsum(lengths, out=row_starts[1:])
        total = int(row_starts[-1])
        starts_per_token = np.repeat(row_starts[:-1], lengths)  # [T]
        slots = np.repeat(np.array([slot_of[r.execution_id] for r in step.rows], dtype=np.int32), lengths)
        target_mask = _concat([r.target_mask for r in step.rows], np.bool_)
        per_slot = np.array([self._coefficient[e] for e in execution_ids], dtype=np.float64)  # [E]
        micro_step = MicroStep(
            batch=self._batch,
            index=self._emitted,
            closes_stream=closes,
            rows=tuple(RowKey(r.execution_id, r.trajectory) for r in step.rows),
            execution_ids=execution_ids,
            execution_advantages=np.array([self._advantage[e] for e in execution_ids], dtype=np.float64),
            token_ids=_concat([r.token_ids for r in step.rows], np.int32),
            position_ids=(np.arange(total, dtype=np.int32) - starts_per_token).astype(np.int32),
            row_starts=row_starts,
            target_mask=target_mask,
            behaviour_logprobs=_concat([r.behaviour_logprobs for r in step.rows], np.float32),
            slots=slots,
            coefficients=np.where(target_mask, per_slot[slots] if total else 0.0, 0.0),
        )
        self._emitted += 1
        return micro_step


def _concat(arrays: list[npt.NDArray[_Scalar]], dtype: type[_Scalar]) -> npt.NDArray[_Scalar]:
    if not arrays:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(arrays).astype(dtype, copy=False)
