"""The shared event-log contract, on the in-memory implementation."""

from __future__ import annotations

import pytest

from gyre_store import InMemoryEventLog
from tests.unit.store.contract import EventLogContract


class TestInMemoryEventLog(EventLogContract):
    @pytest.fixture
    def log(self) -> InMemoryEventLog:
        return InMemoryEventLog()
