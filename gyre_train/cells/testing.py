"""In-memory claim queues, batch board and weight sink: cells in threads of one process share them.

`InMemoryClaims` is to the queues and the board what a Redis server is to the Redis adapters: the
state of one run's queues (one per batch) and its board, with the heartbeats they share, behind
one lock. Time comes from a `Clock`, so a test can let claims go idle without sleeping. They pass
the contract suite of the Redis adapters (tests/unit/train/claims_contract.py). `InMemoryWeightSink`
is an engine that keeps the weights it is sent. Nothing survives the process.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gyre_proxy.engines import EngineError
from gyre_proxy.engines.weights import BroadcastGroup, WeightUpdateGroup
from gyre_train.cells.board import SnapshotDescriptor
from gyre_train.cells.claims import PendingClaim, Phase, QueueConfig, Task
from gyre_train.cells.membership import ReducePlan
from gyre_train.cells.wire import BatchManifest, RatioShare
from gyre_train.exceptions import ClaimQueueError
from gyre_train.objective import ExecutionClip
from gyre_train.rewards import Clock, MonotonicClock
from gyre_train.trajectories import MicroStep


class InMemoryClaims:
    """One run's in-memory queues and board; every operation holds the run's lock."""

    def __init__(self, config: QueueConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or MonotonicClock()
        self.lock = threading.RLock()
        self._expiry: dict[int, float] = {}  # cell -> when its heartbeat expires
        self._queues: dict[int, InMemoryMicroStepQueue] = {}
        self.board = InMemoryBatchBoard(self)

    def queue(self, batch: int) -> InMemoryMicroStepQueue:
        """The queue of `batch` (the same one on every call)."""
        with self.lock:
            if batch not in self._queues:
                self._queues[batch] = InMemoryMicroStepQueue(self, batch)
            return self._queues[batch]

    def beat(self, cell: int) -> None:
        """Renew `cell`'s heartbeat for `claim_timeout_s`."""
        with self.lock:
            self._expiry[cell] = self.clock.now() + self.config.claim_timeout_s

    def alive(self, cells: Collection[int]) -> frozenset[int]:
        with self.lock:
            now = self.clock.now()
            return frozenset(c for c in cells if self._expiry.get(c, now) > now)

    def expire(self, cell: int) -> None:
        """Now, what the run shows `claim_timeout_s` after `cell` stopped renewing: its heartbeat
        out and its claims idle enough to take over (a test's dead cell, without the wait)."""
        with self.lock:
            idle_since = self.clock.now() - self.config.claim_timeout_s
            self._expiry.pop(cell, None)
            for queue in self._queues.values():
                queue.idle_since(cell, idle_since)


@dataclass(slots=True)
class _Claim:
    """A delivered, unacknowledged entry."""

    cell: int
    delivered_at: float
    deliveries: int


def _sequence(message_id: str) -> int:
    return int(message_id.split("-")[0])


class InMemoryMicroStepQueue:
    """`MicroStepQueue` in memory: entries in a list, pending claims in a dict, like a Redis stream
    with one consumer group."""

    def __init__(self, claims: InMemoryClaims, batch: int) -> None:
        self._claims = claims
        self._lock = claims.lock
        self._batch = batch
        self._entries: list[tuple[str, Phase, int]] = []  # (message id, phase, micro-step index)
        self._delivered = 0  # entries before this one have been delivered at least once
        self._pending: dict[str, _Claim] = {}
        self._steps: dict[int, MicroStep] = {}
        self._manifest: BatchManifest | None = None
        self._ratios: dict[int, RatioShare] = {}
        self._clip: ExecutionClip | None = None
        self._claims_made = 0

    @property
    def batch(self) -> int:
        return self._batch

    def _append(self, phase: Phase, index: int) -> None:
        self._entries.append((f"{len(self._entries) + 1}-0", phase, index))

    def put(self, step: MicroStep) -> None:
        if step.batch != self._batch:
            raise ClaimQueueError(f"micro-step of batch {step.batch} put into batch {self._batch}")
        with self._lock:
            self._steps[step.index] = step
            self._append(Phase.RATIOS, step.index)

    def close(self, manifest: BatchManifest) -> None:
        with self._lock:
            self._manifest = manifest

    def manifest(self) -> BatchManifest | None:
        with self._lock:
            return self._manifest

    def micro_step(self, index: int) -> MicroStep:
        with self._lock:
            if index not in self._steps:
                raise ClaimQueueError(f"batch {self._batch} has no micro-step {index}")
            return self._steps[index]

    def _deliver(self, cell: int, message_id: str, deliveries: int) -> Task:
        self._pending[message_id] = _Claim(cell, self._claims.clock.now(), deliveries)
        _, phase, index = self._entries[_sequence(message_id) - 1]
        return Task(message_id, phase, index, deliveries)

    def claim(self, cell: int) -> Task | None:
        with self._lock:
            if self._delivered == len(self._entries):
                return None
            message_id = self._entries[self._delivered][0]
            self._delivered += 1
            self._claims_made += 1
            return self._deliver(cell, message_id, 1)

    def reclaim(self, cell: int) -> Task | None:
        with self._lock:
            now = self._claims.clock.now()
            for message_id in sorted(self._pending, key=_sequence):
                claim = self._pending[message_id]
                if now - claim.delivered_at >= self._claims.config.claim_timeout_s:
                    return self._deliver(cell, message_id, claim.deliveries + 1)
            return None

    def idle_since(self, cell: int, when: float) -> None:
        """Every claim `cell` holds counts as delivered at `when` (see `InMemoryClaims.expire`)."""
        with self._lock:
            for claim in self._pending.values():
                if claim.cell == cell:
                    claim.delivered_at = min(claim.delivered_at, when)

    def take_over(self, cell: int, message_id: str) -> Task | None:
        with self._lock:
            claim = self._pending.get(message_id)
            return None if claim is None else self._deliver(cell, message_id, claim.deliveries + 1)

    def renew(self, cell: int, message_ids: Iterable[str]) -> frozenset[str]:
        with self._lock:
            self._claims.beat(cell)
            now = self._claims.clock.now()
            owned = [m for m in message_ids if (c := self._pending.get(m)) is not None and c.cell == cell]
            for message_id in owned:
                self._pending[message_id].delivered_at = now
            return frozenset(owned)

    def ack(self, message_ids: Sequence[str]) -> int:
        with self._lock:
            return sum(self._pending.pop(m, None) is not None for m in set(message_ids))

    def pending(self) -> list[PendingClaim]:
        with self._lock:
            now = self._claims.clock.now()
            return [
                PendingClaim(m, c.cell, int((now - c.delivered_at) * 1000), c.deliveries)
                for m, c in sorted(self._pending.items(), key=lambda item: _sequence(item[0]))
            ]

    def put_ratio(self, share: RatioShare) -> bool:
        with self._lock:
            if share.index in self._ratios:
                return False
            self._ratios[share.index] = share
            return True

    def ratio_shares(self) -> list[RatioShare]:
        with self._lock:
            return [self._ratios[i] for i in sorted(self._ratios)]

    def ratio_count(self) -> int:
        with self._lock:
            return len(self._ratios)

    def open_gradients(self, clip: ExecutionClip) -> None:
        with self._lock:
            if self._manifest is None:
                raise ClaimQueueError(f"batch {self._batch} is not closed; pass 2 cannot start")
            if self._clip is not None:
                return
            for index in range(self._manifest.micro_steps):
                self._append(Phase.GRADIENTS, index)
            self._clip = clip

    def clip(self) -> ExecutionClip | None:
        with self._lock:
            return self._clip

    def claims_made(self) -> int:
        with self._lock:
            return self._claims_made


class InMemoryBatchBoard:
    """`BatchBoard` in memory; `alive` reads the heartbeats the run's queues renew."""

    def __init__(self, claims: InMemoryClaims) -> None:
        self._claims = claims
        self._lock = claims.lock
        self._opened: dict[int, int] = {}
        self._closed: set[int] = set()
        self._members: dict[int, dict[int, int]] = collections.defaultdict(dict)
        self._drained: dict[int, dict[int, dict[str, int]]] = collections.defaultdict(dict)
        self._plans: dict[int, ReducePlan] = {}
        self._reduced: dict[int, int] = {}
        self._updated: dict[int, int] = {}
        self._snapshot: SnapshotDescriptor | None = None
        self._pulls: collections.deque[int] = collections.deque()

    def open_batch(self, batch: int, policy_version: int) -> None:
        with self._lock:
            self._opened[batch] = policy_version

    def opened(self, batch: int) -> int | None:
        with self._lock:
            return self._opened.get(batch)

    def join(self, batch: int, cell: int, policy_version: int) -> bool:
        with self._lock:
            if batch in self._closed:
                return False
            self._members[batch][cell] = policy_version
            return True

    def close_window(self, batch: int) -> frozenset[int]:
        with self._lock:
            self._closed.add(batch)
            return self.members(batch)

    def members(self, batch: int) -> frozenset[int]:
        with self._lock:
            return frozenset(self._members.get(batch, {}))

    def alive(self, cells: Collection[int]) -> frozenset[int]:
        return self._claims.alive(cells)

    def report_drained(self, batch: int, cell: int, held: Mapping[str, int]) -> None:
        with self._lock:
            self._drained[batch][cell] = dict(held)

    def drained(self, batch: int) -> dict[int, dict[str, int]]:
        with self._lock:
            return {cell: dict(held) for cell, held in self._drained.get(batch, {}).items()}

    def put_plan(self, plan: ReducePlan) -> None:
        with self._lock:
            self._plans[plan.batch] = plan

    def plan(self, batch: int) -> ReducePlan | None:
        with self._lock:
            return self._plans.get(batch)

    def put_reduced(self, batch: int, attempt: int) -> None:
        with self._lock:
            self._reduced[batch] = attempt

    def reduced(self, batch: int) -> int | None:
        with self._lock:
            return self._reduced.get(batch)

    def put_updated(self, batch: int, policy_version: int) -> None:
        with self._lock:
            self._updated[batch] = policy_version

    def updated(self, batch: int) -> int | None:
        with self._lock:
            return self._updated.get(batch)

    def put_snapshot(self, descriptor: SnapshotDescriptor) -> None:
        with self._lock:
            self._snapshot = descriptor

    def snapshot(self) -> SnapshotDescriptor | None:
        with self._lock:
            return self._snapshot

    def request_pull(self, cell: int) -> None:
        with self._lock:
            self._pulls.append(cell)

    def next_pull(self) -> int | None:
        with self._lock:
            return self._pulls.popleft() if self._pulls else None


@dataclass
class InMemoryWeightSink:
    """A `WeightSink` that keeps what it is sent: `served` holds (policy version, named tensors
    or the folder they were saved in) per load. With `refuse` set, every call raises it."""

    name: str = "memory"
    refuse: EngineError | None = None
    served: list[tuple[int, dict[str, torch.Tensor] | Path]] = field(default_factory=list)
    groups: dict[str, WeightUpdateGroup] = field(default_factory=dict)

    def _check(self) -> None:
        if self.refuse is not None:
            raise self.refuse

    async def load_from_disk(self, path: Path, policy_version: int) -> None:
        self._check()
        self.served.append((policy_version, path))

    async def load_tensors(self, tensors: Mapping[str, torch.Tensor], policy_version: int) -> None:
        self._check()
        self.served.append((policy_version, {n: t.detach().clone() for n, t in tensors.items()}))

    async def join_group(self, group: BroadcastGroup, rank_offset: int) -> None:
        self._check()
        self.groups[group.name] = await asyncio.to_thread(
            WeightUpdateGroup, master_address=group.master_address, master_port=group.master_port,
            rank=rank_offset, world_size=group.world_size, group_name=group.name,
        )  # fmt: skip

    async def receive_broadcast(
        self, group: BroadcastGroup, tensors: Mapping[str, torch.Tensor], policy_version: int
    ) -> None:
        self._check()
        end = self.groups[group.name]

        def receive() -> dict[str, torch.Tensor]:
            return {n: end.broadcast(torch.empty(t.shape, dtype=t.dtype)) for n, t in tensors.items()}

        self.served.append((policy_version, await asyncio.to_thread(receive)))

    async def leave_group(self, group: BroadcastGroup) -> None:
        self.groups.pop(group.name).close()
