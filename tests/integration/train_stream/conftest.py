"""Fixtures for streaming-training tests: a Redis client and a key prefix of their own."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Set

import pytest
import redis

from gyre_train.cells import RedisBatchBoard


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
