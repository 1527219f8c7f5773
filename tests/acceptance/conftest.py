"""Acceptance tests run the ``gyre`` command as a user would, in subprocesses."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns, pg, pgcluster
from tests.real_servers import require

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


# -- hosts made of network namespaces, with PostgreSQL and Redis on the first ------------------


@pytest.fixture
def hosts() -> Iterator[netns.Network]:
    """A bridge whose first address is the test's own namespace (host A); add hosts to it."""
    with netns.network() as net:
        yield net


@pytest.fixture
def hosts_database(hosts: netns.Network) -> Iterator[str]:
    """A private PostgreSQL on host A, reachable from the other hosts: its URL at A's address."""
    require("postgres_binaries", pgcluster.missing())
    cluster = pgcluster.PrivateCluster(listen=(hosts.gateway,), trust=f"{hosts.gateway}/24").init()
    try:
        yield cluster.url_at(hosts.gateway)
    finally:
        cluster.destroy()


@pytest.fixture
def hosts_redis(hosts: netns.Network, tmp_path: Path) -> Iterator[str]:
    """A private Redis on host A, reachable from the other hosts: its URL at A's address."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        port = int(sock.getsockname()[1])
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", f"127.0.0.1 {hosts.gateway}", "--save", "",
         "--appendonly", "no", "--protected-mode", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
        yield f"redis://{hosts.gateway}:{port}/0"
    finally:
        server.terminate()
        server.wait(30)
