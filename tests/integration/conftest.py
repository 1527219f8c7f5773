"""Fixtures for integration tests: real PostgreSQL and Redis on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from gyre_store import PostgresEventLog, StoreConfig
from tests import pg

pytestmark = pytest.mark.integration


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = pg.create_template()
    yield name
    pg.drop(name)


@pytest.fixture
def database_url(pg_template: str) -> Iterator[str]:
    with pg.database_from(pg_template) as url:
        yield url


@pytest.fixture
def pg_log(database_url: str) -> Iterator[PostgresEventLog]:
    with PostgresEventLog(StoreConfig(database_url)) as log:
        yield log


@pytest.fixture
def redis_url() -> str:
    return os.environ.get("GYRE_TEST_REDIS", "redis://127.0.0.1:6379/0")
