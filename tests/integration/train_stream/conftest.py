"""Fixtures for streaming-training tests: a Redis client and a key prefix of their own, and time
let pass for a run's claims and heartbeats without sleeping."""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterator, Set

import pytest
import redis

from gyre_train.cells import RedisBatchBoard
from gyre_train.cells.claims import GROUP, consumer_name

# What Redis shows ARGV[1] ms later when the cells stopped renewing: each pending claim of the
# streams in KEYS that much idler (XCLAIM to its own holder with IDLE; JUSTID counts no delivery),
# and each heartbeat in KEYS that much closer to expiry (gone once it would be). ARGV[3...] name
# the consumers whose claims age; none: every consumer's.
ELAPSE = """
local ms = tonumber(ARGV[1])
local only = {}
for i = 3, #ARGV do only[ARGV[i]] = true end
for _, key in ipairs(KEYS) do
  if redis.call('TYPE', key)['ok'] == 'stream' then
    for _, p in ipairs(redis.call('XPENDING', key, ARGV[2], '-', '+', 1000000)) do
      if #ARGV < 3 or only[p[2]] then
        redis.call('XCLAIM', key, ARGV[2], p[2], 0, p[1], 'IDLE', p[3] + ms, 'JUSTID')
      end
    end
  else
    local ttl = redis.call('PTTL', key)
    if ttl > ms then redis.call('PEXPIRE', key, ttl - ms) elseif ttl >= 0 then redis.call('DEL', key) end
  end
end
"""


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A unique key prefix; every key under it is deleted after the test."""
    name = f"gyre:test:{uuid.uuid4().hex[:12]}"
    yield name
    keys = list(redis_client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        redis_client.delete(*keys)


def wait_for_members(board: RedisBatchBoard, batch: int, cells: Set[int], timeout_s: float = 120) -> None:
    """Block until `cells` joined `batch` (so a test's batch starts with its satellites in)."""
    deadline = time.monotonic() + timeout_s
    while not cells <= board.members(batch):
        assert time.monotonic() < deadline, f"cells {sorted(cells - board.members(batch))} never joined"
        time.sleep(0.01)


def elapse(client: redis.Redis, prefix: str, seconds: float, cells: Collection[int] = ()) -> None:
    """Let `seconds` pass for the claims and heartbeats under `prefix` (those of `cells` only, when
    given) as the claim timeout sees them, without sleeping: a test never races the machine's
    clock to reach a timeout, and real time can only add to what it lets pass."""
    streams = [k.decode() for k in client.scan_iter(match=f"{prefix}:b*:tasks", count=1000)]
    if cells:
        beats = [f"{prefix}:hb:{c}" for c in cells]
    else:
        beats = [k.decode() for k in client.scan_iter(match=f"{prefix}:hb:*", count=1000)]
    keys = streams + beats
    if keys:
        consumers = [consumer_name(c) for c in cells]
        client.eval(ELAPSE, len(keys), *keys, int(seconds * 1000), GROUP, *consumers)
