"""Acceptance tests run the ``gyre`` command as a user would, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import pg

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/acceptance" in str(item.fspath):
            item.add_marker(pytest.mark.acceptance)


def gyre(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``gyre ARGS`` with a clean GYRE_* environment plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    base.update(env or {})
    base["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "gyre_tools.cli", *args],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def acceptance_template() -> Iterator[str]:
    name = pg.create_template()
    yield name
    pg.drop(name)


@pytest.fixture
def fresh_database_url(acceptance_template: str) -> Iterator[str]:
    with pg.database_from(acceptance_template) as url:
        yield url
