"""The shared event-log contract, on real PostgreSQL (both append paths)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gyre_store import PostgresEventLog, StoreConfig
from tests.unit.store.contract import EventLogContract


class TestPostgresEventLog(EventLogContract):
    @pytest.fixture(params=["function-path", "copy-path"])
    def log(self, request: pytest.FixtureRequest, database_url: str) -> Iterator[PostgresEventLog]:
        # copy_threshold=1 sends every batch through COPY; the default sends small ones
        # through gyre_append_v1. Both must satisfy the same contract.
        threshold = 1 if request.param == "copy-path" else 32
        with PostgresEventLog(StoreConfig(database_url, copy_threshold=threshold)) as log:
            yield log
