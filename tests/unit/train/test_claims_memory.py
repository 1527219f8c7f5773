"""The shared claim-queue and batch-board contract, on the in-memory implementation (a fake clock,
so claims go idle without sleeping)."""

from __future__ import annotations

import pytest

from gyre_train.cells import InMemoryClaims, QueueConfig
from tests.unit.train.claims_contract import TIMEOUT_S, Claims, ClaimsContract
from tests.unit.train.test_evaluation import FakeClock


class TestInMemoryClaims(ClaimsContract):
    @pytest.fixture
    def run(self) -> Claims:
        clock = FakeClock()
        claims = InMemoryClaims(QueueConfig("memory", claim_timeout_s=TIMEOUT_S), clock)
        return Claims(claims.queue, claims.board, clock.sleep)
