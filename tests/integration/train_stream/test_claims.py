"""The shared claim-queue and batch-board contract, on the Redis adapters against a real Redis:
disjoint claims, takeover of a silent cell's claims (XAUTOCLAIM's cursor followed), renewal and
heartbeats, first-write-wins pass-1 shares, the join window. Time is let pass by `elapse` (see
tests/integration/train_stream/conftest.py), not slept."""

from __future__ import annotations

from functools import partial

import pytest
import redis

from gyre_train.cells import QueueConfig, RedisBatchBoard, RedisMicroStepQueue
from tests.integration.train_stream.conftest import elapse
from tests.unit.train.claims_contract import TIMEOUT_S, Claims, ClaimsContract


class TestRedisClaims(ClaimsContract):
    @pytest.fixture
    def run(self, redis_client: redis.Redis, prefix: str) -> Claims:
        config = QueueConfig(prefix, claim_timeout_s=TIMEOUT_S)
        return Claims(
            partial(RedisMicroStepQueue, redis_client, config),
            RedisBatchBoard(redis_client, config),
            partial(elapse, redis_client, prefix),
        )
