"""The batch board: the `BatchBoard` protocol and its Redis adapter.

Everything a cell must agree on with the others besides the claims themselves: membership, the
join window, drained reports, the reduce plan, heartbeats, and the weight-snapshot descriptor
satellites pull from. Joining and closing the window are atomic against each other, so the members
the core reads after closing are exactly the cells that will take part. `RedisBatchBoard` keeps
its keys under the run's prefix; the in-memory board is in `testing.py`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

import msgspec
import redis

from gyre_train.cells.claims import QueueConfig
from gyre_train.cells.membership import ReducePlan

# A cell joins only while the window is open; KEYS[1] the window flag, KEYS[2] the members hash.
JOIN_BATCH = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""


class SnapshotDescriptor(msgspec.Struct, frozen=True, array_like=True):
    """Where the core's current weights can be read: version, size and transport details."""

    policy_version: int
    numel: int
    transport: str
    segment: str = ""  # Mooncake: the core's segment name (host:rpc_port)
    address: int = 0  # Mooncake: the registered buffer's address in the core


class SnapshotBoard(Protocol):
    """What a weight transport needs from the board."""

    def put_snapshot(self, descriptor: SnapshotDescriptor) -> None:
        """Core: where its current weights can be read (replaces the previous descriptor)."""
        ...

    def snapshot(self) -> SnapshotDescriptor | None: ...

    def request_pull(self, cell: int) -> None:
        """Satellite: ask the core to send its snapshot (transports that need the core's help)."""
        ...

    def next_pull(self) -> int | None:
        """Core: the oldest pull request not yet answered (first in, first out), or None."""
        ...


class BatchBoard(SnapshotBoard, Protocol):
    """The board of one run (all its batches), as the core and the satellites see it.

    `alive` reads the heartbeats that `MicroStepQueue.renew` writes: a queue and the board of one
    run share them. Every implementation passes tests/unit/train/claims_contract.py.
    """

    def open_batch(self, batch: int, policy_version: int) -> None:
        """The core trains `batch` from weights at `policy_version` (its snapshot is exposed)."""
        ...

    def opened(self, batch: int) -> int | None:
        """The policy version `batch` was opened at, or None before."""
        ...

    def join(self, batch: int, cell: int, policy_version: int) -> bool:
        """Register `cell` for `batch`; False once the join window has closed."""
        ...

    def close_window(self, batch: int) -> frozenset[int]:
        """Close the join window; returns the satellites that joined before it closed."""
        ...

    def members(self, batch: int) -> frozenset[int]: ...

    def alive(self, cells: Collection[int]) -> frozenset[int]:
        """The cells whose heartbeat (renewed with their claims) has not expired."""
        ...

    def report_drained(self, batch: int, cell: int, held: Mapping[str, int]) -> None:
        """`cell` stops claiming for `batch`; `held` maps its gradient claims to micro-steps."""
        ...

    def drained(self, batch: int) -> dict[int, dict[str, int]]: ...

    def put_plan(self, plan: ReducePlan) -> None:
        """Post the batch's reduce plan (a newer attempt replaces the older)."""
        ...

    def plan(self, batch: int) -> ReducePlan | None: ...

    def put_reduced(self, batch: int, attempt: int) -> None:
        """The core received the reduction of plan `attempt`; its members' part is done."""
        ...

    def reduced(self, batch: int) -> int | None: ...

    def put_updated(self, batch: int, policy_version: int) -> None:
        """The core made the batch's update; satellites may move on."""
        ...

    def updated(self, batch: int) -> int | None: ...


class RedisBatchBoard:
    """The board of one run (all its batches) under `config.prefix`."""

    def __init__(self, client: redis.Redis, config: QueueConfig) -> None:
        self._redis: Any = client  # bytes mode; redis-py's answer types are unions
        self._prefix = config.prefix
        self._join = client.register_script(JOIN_BATCH)

    def _key(self, batch: int, name: str) -> str:
        return f"{self._prefix}:b{batch}:{name}"

    # -- batch lifecycle ----------------------------------------------------------------------

    def open_batch(self, batch: int, policy_version: int) -> None:
        self._redis.set(self._key(batch, "open"), policy_version)

    def opened(self, batch: int) -> int | None:
        value = self._redis.get(self._key(batch, "open"))
        return None if value is None else int(value)

    def join(self, batch: int, cell: int, policy_version: int) -> bool:
        keys = [self._key(batch, "window_closed"), self._key(batch, "members")]
        return bool(self._join(keys=keys, args=[cell, policy_version]))

    def close_window(self, batch: int) -> frozenset[int]:
        self._redis.set(self._key(batch, "window_closed"), 1)
        return self.members(batch)

    def members(self, batch: int) -> frozenset[int]:
        return frozenset(int(c) for c in self._redis.hkeys(self._key(batch, "members")))

    def alive(self, cells: Collection[int]) -> frozenset[int]:
        cells = sorted(cells)
        if not cells:
            return frozenset()
        with self._redis.pipeline(transaction=False) as pipe:
            for cell in cells:
                pipe.exists(f"{self._prefix}:hb:{cell}")
            found = pipe.execute()
        return frozenset(c for c, f in zip(cells, found, strict=True) if f)

    def report_drained(self, batch: int, cell: int, held: Mapping[str, int]) -> None:
        self._redis.hset(self._key(batch, "drained"), str(cell), msgspec.msgpack.encode(dict(held)))

    def drained(self, batch: int) -> dict[int, dict[str, int]]:
        raw = self._redis.hgetall(self._key(batch, "drained"))
        return {int(c): msgspec.msgpack.decode(v, type=dict[str, int]) for c, v in raw.items()}

    def put_plan(self, plan: ReducePlan) -> None:
        self._redis.set(self._key(plan.batch, "plan"), plan.encode())

    def plan(self, batch: int) -> ReducePlan | None:
        data = self._redis.get(self._key(batch, "plan"))
        return None if data is None else ReducePlan.decode(data)

    def put_reduced(self, batch: int, attempt: int) -> None:
        self._redis.set(self._key(batch, "reduced"), attempt)

    def reduced(self, batch: int) -> int | None:
        value = self._redis.get(self._key(batch, "reduced"))
        return None if value is None else int(value)

    def put_updated(self, batch: int, policy_version: int) -> None:
        self._redis.set(self._key(batch, "updated"), policy_version)

    def updated(self, batch: int) -> int | None:
        value = self._redis.get(self._key(batch, "updated"))
        return None if value is None else int(value)

    # -- weight snapshots ---------------------------------------------------------------------

    def put_snapshot(self, descriptor: SnapshotDescriptor) -> None:
        self._redis.set(f"{self._prefix}:snapshot", msgspec.msgpack.encode(descriptor))

    def snapshot(self) -> SnapshotDescriptor | None:
        data = self._redis.get(f"{self._prefix}:snapshot")
        return None if data is None else msgspec.msgpack.decode(data, type=SnapshotDescriptor)

    def request_pull(self, cell: int) -> None:
        self._redis.rpush(f"{self._prefix}:pulls", cell)

    def next_pull(self) -> int | None:
        value = self._redis.lpop(f"{self._prefix}:pulls")
        return None if value is None else int(value)

    # -- the run ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Every cell leaves its loop at the next check (end of the run)."""
        self._redis.set(f"{self._prefix}:stop", 1)

    def stopped(self) -> bool:
        return bool(self._redis.exists(f"{self._prefix}:stop"))
