"""The claim queue of a batch: the `MicroStepQueue` protocol and its Redis adapter.

The packing buffer puts micro-steps (`put`) and closes the batch with its manifest (`close`). A
task is (phase, micro-step): phase 1 computes the micro-step's pass-1 share (sums of log rho), phase
2 its gradient; the core enqueues the phase-2 tasks once every pass-1 share is in. Cells claim one
task at a time, so work is disjoint and faster cells take more. A claim stays pending until its
result is in the batch: a pass-1 share when it is stored (first write wins), a gradient when the
core has reduced it. A live cell renews its claims on every loop (heartbeat); a dead cell's claims
go idle and a live cell takes them over after `claim_timeout_s`. `RedisMicroStepQueue` does this
with one stream and consumer group per batch (XREADGROUP COUNT 1, XAUTOCLAIM); the in-memory
queue is in `testing.py`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from gyre_train.cells.wire import (
    BatchManifest,
    RatioShare,
    decode_clip,
    decode_micro_step,
    encode_clip,
    encode_micro_step,
)
from gyre_train.exceptions import ClaimQueueError
from gyre_train.objective import ExecutionClip
from gyre_train.trajectories import MicroStep

GROUP = "cells"

# Renew the claims a cell still owns (reset their idle time without counting a delivery) and its
# heartbeat, atomically: a claim another cell already took over is left alone and not returned.
RENEW_CLAIMS = """
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
local owned = {}
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    table.insert(owned, ARGV[i])
  end
end
return owned
"""


class Phase(enum.IntEnum):
    """What a task computes for its micro-step."""

    RATIOS = 1  # pass 1: per-execution sums of log rho_u, no gradient
    GRADIENTS = 2  # pass 2: the micro-step's share of the batch gradient


@dataclass(frozen=True, slots=True)
class Task:
    """One claimed entry of the batch stream."""

    message_id: str
    phase: Phase
    index: int  # the micro-step's index within its batch
    deliveries: int  # 1 for a first claim, more after a takeover


@dataclass(frozen=True, slots=True)
class PendingClaim:
    """A claimed, unacknowledged entry: who holds it and for how long it has been idle."""

    message_id: str
    cell: int
    idle_ms: int
    deliveries: int


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """Where a run's keys live and how long an unrenewed claim survives its cell."""

    prefix: str
    claim_timeout_s: float = 5.0
    poll_s: float = 0.005


def consumer_name(cell: int) -> str:
    return f"cell-{cell}"


def cell_of(consumer: str) -> int:
    return int(consumer.removeprefix("cell-"))


class MicroStepQueue(Protocol):
    """The claim queue of one batch, as cells and the packing buffer see it.

    Every implementation passes the contract suite in tests/unit/train/claims_contract.py.
    """

    @property
    def batch(self) -> int: ...

    def put(self, step: MicroStep) -> None:
        """Enqueue a micro-step's pass-1 task; ClaimQueueError for another batch's micro-step."""
        ...

    def close(self, manifest: BatchManifest) -> None:
        """The close marker: written after the batch's last micro-step was enqueued."""
        ...

    def manifest(self) -> BatchManifest | None:
        """The close marker, or None while the stream is open."""
        ...

    def micro_step(self, index: int) -> MicroStep:
        """The micro-step put at `index`; ClaimQueueError when there is none."""
        ...

    def claim(self, cell: int) -> Task | None:
        """The next never-delivered task for `cell`, or None when none is left right now."""
        ...

    def reclaim(self, cell: int) -> Task | None:
        """Take over one claim idle for at least `claim_timeout_s` (its cell stopped renewing)."""
        ...

    def renew(self, cell: int, message_ids: Iterable[str]) -> frozenset[str]:
        """Refresh `cell`'s heartbeat and the claims it still owns; returns those it owns."""
        ...

    def take_over(self, cell: int, message_id: str) -> Task | None:
        """Claim one pending entry now, whatever its idle time; None when it is not pending."""
        ...

    def ack(self, message_ids: Sequence[str]) -> int:
        """Drop claims whose result is in the batch; returns how many were pending."""
        ...

    def pending(self) -> list[PendingClaim]:
        """Every claimed, unacknowledged entry, in queue order."""
        ...

    def put_ratio(self, share: RatioShare) -> bool:
        """Store a pass-1 share; False when one was already stored (a redelivered task)."""
        ...

    def ratio_shares(self) -> list[RatioShare]:
        """The stored pass-1 shares, by micro-step index."""
        ...

    def ratio_count(self) -> int: ...

    def open_gradients(self, clip: ExecutionClip) -> None:
        """Store the clip and enqueue one gradient task per micro-step, once, atomically."""
        ...

    def clip(self) -> ExecutionClip | None:
        """The batch's clip once pass 2 is open (then every gradient task is enqueued)."""
        ...

    def claims_made(self) -> int:
        """How many first deliveries this batch has handed out (join triggers count them)."""
        ...


class RedisMicroStepQueue:
    """`MicroStepQueue` on a Redis stream with a consumer group; keys under `prefix:b<batch>:`."""

    def __init__(self, client: redis.Redis, config: QueueConfig, batch: int) -> None:
        # redis-py types answers as unions of bytes, str and int; this adapter runs in bytes mode.
        self._redis: Any = client
        self._config = config
        self._batch = batch
        base = f"{config.prefix}:b{batch}"
        self.stream_key = f"{base}:tasks"
        self._steps_key = f"{base}:steps"
        self._manifest_key = f"{base}:manifest"
        self._ratios_key = f"{base}:ratios"
        self._clip_key = f"{base}:clip"
        self._claims_key = f"{base}:claims"
        self._heartbeat_prefix = f"{config.prefix}:hb:"
        self._renew = client.register_script(RENEW_CLAIMS)
        self._group_ready = False

    @property
    def batch(self) -> int:
        return self._batch

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            # Id 0: the group sees entries added before it existed, so producer and cells may
            # start in any order.
            self._redis.xgroup_create(self.stream_key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise ClaimQueueError(f"cannot create group on {self.stream_key}: {exc}") from exc
        except redis.RedisError as exc:
            raise ClaimQueueError(f"{self.stream_key}: {exc}") from exc
        self._group_ready = True

    def put(self, step: MicroStep) -> None:
        """Enqueue a micro-step's pass-1 task; its bytes are stored once, by index."""
        if step.batch != self._batch:
            raise ClaimQueueError(f"micro-step of batch {step.batch} put into batch {self._batch}")
        self._ensure_group()
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._steps_key, str(step.index), encode_micro_step(step))
            pipe.xadd(self.stream_key, {"phase": int(Phase.RATIOS), "index": step.index})
            pipe.execute()

    def close(self, manifest: BatchManifest) -> None:
        self._redis.set(self._manifest_key, manifest.encode())

    def manifest(self) -> BatchManifest | None:
        data = self._redis.get(self._manifest_key)
        return None if data is None else BatchManifest.decode(data)

    def micro_step(self, index: int) -> MicroStep:
        data = self._redis.hget(self._steps_key, str(index))
        if data is None:
            raise ClaimQueueError(f"batch {self._batch} has no micro-step {index}")
        return decode_micro_step(data)

    def _task(self, message_id: bytes | str, fields: dict[bytes, bytes], deliveries: int) -> Task:
        ident = message_id.decode() if isinstance(message_id, bytes) else message_id
        return Task(ident, Phase(int(fields[b"phase"])), int(fields[b"index"]), deliveries)

    def claim(self, cell: int) -> Task | None:
        self._ensure_group()
        answer = self._redis.xreadgroup(GROUP, consumer_name(cell), {self.stream_key: ">"}, count=1)
        if not answer:
            return None
        _, entries = answer[0]
        if not entries:
            return None
        message_id, fields = entries[0]
        self._redis.incr(self._claims_key)
        return self._task(message_id, fields, 1)

    def reclaim(self, cell: int) -> Task | None:
        """Take over one claim idle for longer than the timeout (its cell stopped renewing)."""
        self._ensure_group()
        min_idle = int(self._config.claim_timeout_s * 1000)
        # XAUTOCLAIM looks at no more than 10 x COUNT pending entries per call: follow its cursor
        # through the whole list, or a dead cell's claims behind >= 10 live ones are never seen.
        start: bytes | str = "0-0"
        while True:
            answer = self._redis.xautoclaim(
                self.stream_key, GROUP, consumer_name(cell), min_idle, start_id=start, count=1
            )
            cursor, entries = answer[0], answer[1]
            if entries:
                break
            if cursor in (b"0-0", "0-0"):
                return None
            start = cursor
        message_id, fields = entries[0]
        if fields is None:  # trimmed entry; never happens since the stream is not trimmed
            return None
        info = self._redis.xpending_range(self.stream_key, GROUP, message_id, message_id, 1)
        deliveries = int(info[0]["times_delivered"]) if info else 2
        return self._task(message_id, fields, deliveries)

    def take_over(self, cell: int, message_id: str) -> Task | None:
        """Claim one entry now, whatever its idle time (the core, for cells outside the prefix)."""
        self._ensure_group()
        entries = self._redis.xclaim(self.stream_key, GROUP, consumer_name(cell), 0, [message_id])
        if not entries or entries[0][1] is None:
            return None
        fields = entries[0][1]
        info = self._redis.xpending_range(self.stream_key, GROUP, message_id, message_id, 1)
        deliveries = int(info[0]["times_delivered"]) if info else 2
        return self._task(entries[0][0], fields, deliveries)

    def renew(self, cell: int, message_ids: Iterable[str]) -> frozenset[str]:
        self._ensure_group()
        ttl = int(self._config.claim_timeout_s * 1000)
        heartbeat = f"{self._heartbeat_prefix}{cell}"
        owned = self._renew(
            keys=[self.stream_key, heartbeat], args=[GROUP, consumer_name(cell), ttl, *message_ids]
        )
        return frozenset(m.decode() if isinstance(m, bytes) else str(m) for m in owned)

    def ack(self, message_ids: Sequence[str]) -> int:
        if not message_ids:
            return 0
        return int(self._redis.xack(self.stream_key, GROUP, *message_ids))

    def pending(self) -> list[PendingClaim]:
        self._ensure_group()
        rows = self._redis.xpending_range(self.stream_key, GROUP, "-", "+", 1_000_000)
        return [
            PendingClaim(
                message_id=r["message_id"].decode(),
                cell=cell_of(r["consumer"].decode()),
                idle_ms=int(r["time_since_delivered"]),
                deliveries=int(r["times_delivered"]),
            )
            for r in rows
        ]

    def put_ratio(self, share: RatioShare) -> bool:
        return bool(self._redis.hsetnx(self._ratios_key, str(share.index), share.encode()))

    def ratio_shares(self) -> list[RatioShare]:
        values = self._redis.hgetall(self._ratios_key)
        return sorted((RatioShare.decode(v) for v in values.values()), key=lambda s: s.index)

    def ratio_count(self) -> int:
        return int(self._redis.hlen(self._ratios_key))

    def open_gradients(self, clip: ExecutionClip) -> None:
        """Store the batch's clip and enqueue one gradient task per micro-step (core only)."""
        manifest = self.manifest()
        if manifest is None:
            raise ClaimQueueError(f"batch {self._batch} is not closed; pass 2 cannot start")
        if self._redis.exists(self._clip_key):
            return  # already opened (a restarted core): the tasks are in the stream
        # The clip is written in the same transaction as the tasks: a cell that sees the clip and
        # then finds nothing to claim knows every gradient task has been handed out.
        with self._redis.pipeline(transaction=True) as pipe:
            for index in range(manifest.micro_steps):
                pipe.xadd(self.stream_key, {"phase": int(Phase.GRADIENTS), "index": index})
            pipe.set(self._clip_key, encode_clip(clip))
            pipe.execute()

    def clip(self) -> ExecutionClip | None:
        data = self._redis.get(self._clip_key)
        return None if data is None else decode_clip(data)

    def claims_made(self) -> int:
        value = self._redis.get(self._claims_key)
        return 0 if value is None else int(value)

    def delete(self) -> None:
        """Drop every key of this batch (after its update, or in tests)."""
        base = self.stream_key.removesuffix(":tasks")
        keys = [self.stream_key, self._steps_key, self._manifest_key, self._ratios_key, self._clip_key]
        self._redis.delete(*keys, self._claims_key, *self._redis.keys(f"{base}:*"))
