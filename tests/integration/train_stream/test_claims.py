"""The shared claim-queue and batch-board contract, on the Redis adapters against a real Redis:
disjoint claims, takeover of a silent cell's claims (XAUTOCLAIM's cursor followed), renewal and
heartbeats, first-write-wins pass-1 shares, the join window."""

from __future__ import annotations

import time
from functools import partial

import pytest
import redis

from gyre_train.cells import QueueConfig, RedisBatchBoard, RedisMicroStepQueue
from tests.unit.train.claims_contract import TIMEOUT_S, Claims, ClaimsContract


class TestRedisClaims(ClaimsContract):
    @pytest.fixture
    def run(self, redis_client: redis.Redis, prefix: str) -> Claims:
        config = QueueConfig(prefix, claim_timeout_s=TIMEOUT_S)
        return Claims(
            partial(RedisMicroStepQueue, redis_client, config),
            RedisBatchBoard(redis_client, config),
            time.sleep,
        )
