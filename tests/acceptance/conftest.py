"""Acceptance tests run the ``gyre`` command as a user would, in subprocesses."""

from __future__ import annotations

import os
import re
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


REPLAY_COUNTS = re.compile(r"(\d+) (differ|violations|disagreements)\b")


def replay_counts(stdout: str) -> dict[str, int]:
    """The counts ``gyre sched replay`` reports, by word: ``{"differ": 0, "violations": 0, ...}``.

    Parsed as numbers: a substring test for "0 differ" would also pass on "10 differ"."""
    counts: dict[str, int] = {}
    for number, word in REPLAY_COUNTS.findall(" ".join(stdout.split())):
        # A word may appear in several rows (per kind); a clean replay has every one at 0.
        counts[word] = counts.get(word, 0) + int(number)
    return counts


def assert_replay_clean(replay: subprocess.CompletedProcess[str], *words: str) -> None:
    """``gyre sched replay`` exited 0 and reported each of ``words`` (default: differ,
    violations, disagreements) present and at 0."""
    assert replay.returncode == 0, replay.stdout + replay.stderr
    counts = replay_counts(replay.stdout)
    for word in words or ("differ", "violations", "disagreements"):
        assert counts.get(word) == 0, f"replay reported {counts.get(word)} {word}:\n{replay.stdout}"


@pytest.fixture(scope="session")
def acceptance_template() -> Iterator[str]:
    name = pg.create_template()
    yield name
    pg.drop(name)


@pytest.fixture
def fresh_database_url(acceptance_template: str) -> Iterator[str]:
    with pg.database_from(acceptance_template) as url:
        yield url
