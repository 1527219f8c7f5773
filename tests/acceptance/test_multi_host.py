"""A live run over several hosts, made of network namespaces (tests/netns.py).

Host A is the test's own namespace, at the bridge's address: it runs PostgreSQL, Redis and
`gyre run` (the proxy, the launcher, the evaluator, the controller, and a node agent with the
rollout engines and the core cell, told to listen on every address and to advertise A's).
Host B is a namespace of its own: it runs `gyre node serve --trainers 1`, a satellite that
reaches A only at A's address on the bridge (its 127.0.0.1 is its own). The run must train
every step with the satellite on B joining the core's batches: it finds the core's
torch.distributed rendezvous in the log (``trainer.world_started``), claims micro-steps from
Redis on A and reduces its gradients with the core over gloo, between the hosts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import netns, pgcluster
from tests.acceptance.conftest import ROOT, assert_replay_clean, gyre
from tests.real_servers import require

pytestmark = [pytest.mark.timeout(900)]

RUN = "hosts-run"
CONFIG = """
seed = 3
steps = 3
policy = "async"
mu = 1
B = 2
N = 2
cells = 2
trainers = "0"  # the core here; the satellite, cell 1, on host B
rollout_engines = 2
engine_capacity = 4
harness = "builtin"
[model]
init = "random"
max_tokens = 48
max_context = 512  # a row is about 414 tokens
[train]
micro_step_tokens = 512  # one row per micro-step: four per batch, for both cells to claim
skip_zero_advantage = false  # an untrained policy scores 0: its rows still flow through the cells
[tasks]
train = 6
heldout = 2
budget_s = 90
[eval]
heldout = false
"""


@pytest.fixture
def hosts() -> Iterator[netns.Network]:
    with netns.network() as net:
        yield net


@pytest.fixture
def cluster(hosts: netns.Network) -> Iterator[pgcluster.PrivateCluster]:
    """PostgreSQL on host A, reachable from the other hosts at A's address."""
    require("postgres_binaries", pgcluster.missing())
    cluster = pgcluster.PrivateCluster(listen=(hosts.gateway,), trust=f"{hosts.gateway}/24").init()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def redis_url(hosts: netns.Network, tmp_path: Path) -> Iterator[str]:
    """Redis on host A, reachable from the other hosts at A's address."""
    port = _free_port()
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def _rows(url: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]


def _logs(*folders: Path) -> str:
    out = []
    for folder in folders:
        for path in sorted(folder.rglob("*.log")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2500:]}")
    return "\n".join(out)


def test_a_satellite_on_another_host_joins_the_cores_batches(
    hosts: netns.Network, cluster: pgcluster.PrivateCluster, redis_url: str, tmp_path: Path
) -> None:
    b = hosts.add_host("b")
    url_a = cluster.url_at(hosts.gateway)
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    base = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    shared = {
        "GYRE_DATABASE_URL": url_a,
        "GYRE_REDIS_URL": redis_url,
        "GYRE_DATA_DIR": str(tmp_path / "data"),
    }
    # Host A: gyre run, its node's engines and core on every address, advertising A's.
    env_a = base | shared | {"GYRE_NODE_HOST": "0.0.0.0", "GYRE_NODE_ADVERTISE_HOST": hosts.gateway}
    started = time.monotonic()
    log_a = (tmp_path / "gyre-run.log").open("wb")
    run = subprocess.Popen(
        [sys.executable, "-m", "gyre_tools.cli", "run", "--config", str(config), "--run-id", RUN,
         "--json", str(tmp_path / "run.json"), "--quiet"],
        cwd=ROOT, env=env_a, stdout=log_a, stderr=subprocess.STDOUT,
    )  # fmt: skip
    host_b = tmp_path / "host-b"
    host_b.mkdir()
    log_b = (host_b / "node-b.log").open("wb")
    node_b: subprocess.Popen[bytes] | None = None
    try:
        # Host B's node agent, once the run is configured (it reads the run's recorded config).
        deadline = time.monotonic() + 120
        while True:
            assert run.poll() is None, f"gyre run ended early\n{_logs(tmp_path)}"
            assert time.monotonic() < deadline, f"the run was not configured\n{_logs(tmp_path)}"
            try:
                if _rows(url_a, "SELECT 1 FROM gyre_events WHERE event_type = 'run.configured'"):
                    break
            except psycopg.Error:
                pass  # not migrated yet
            time.sleep(0.5)
        node_b = subprocess.Popen(
            b.command([sys.executable, "-m", "gyre_tools.cli", "node", "serve", "--run", RUN,
                       "--engines", "none", "--trainers", "1", "--host", b.address]),
            cwd=ROOT, env=base | shared, stdout=log_b, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            run.wait(600)
        except subprocess.TimeoutExpired:
            pytest.fail(f"gyre run did not finish within 600 s\n{_logs(tmp_path)}")
        assert run.returncode == 0, _logs(tmp_path)
    finally:
        for process in (run, node_b):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
        log_a.close()
        log_b.close()
    seconds = time.monotonic() - started
    print(f"multi-host run: {seconds:.1f} s")
    print((tmp_path / "gyre-run.log").read_text(errors="replace")[-1500:])

    summary = json.loads((tmp_path / "run.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [0, 1, 2]
    # The core's world is recorded with A's address; the satellite on B joined it.
    [(dist_init,)] = _rows(
        url_a, "SELECT body->>'dist_init' FROM gyre_events WHERE event_type = 'trainer.world_started'"
    )
    assert dist_init.startswith(f"tcp://{hosts.gateway}:"), dist_init
    joined = _rows(url_a, "SELECT (body->>'batch')::int FROM gyre_events "
                          "WHERE event_type = 'train.cell_joined' AND (body->>'cell')::int = 1")  # fmt: skip
    assert sorted(b for (b,) in joined) == [0, 1, 2], _logs(tmp_path)
    # Both cells computed micro-steps of every batch, and each counted exactly once.
    by_cell = _rows(url_a, "SELECT (body->>'batch')::int, (body->>'cell')::int, count(*) FROM gyre_events "
                           "WHERE event_type = 'train.contribution' GROUP BY 1, 2")  # fmt: skip
    assert {(batch, cell) for batch, cell, _ in by_cell} >= {(0, 1), (1, 1), (2, 1)}, by_cell
    for batch, micro_steps, cells in _rows(
        url_a,
        "SELECT (body->>'batch')::int, (body->>'micro_steps')::int, body->'cells' FROM gyre_events "
        "WHERE event_type = 'train.update'",
    ):
        counted = [m for (m,) in _rows(url_a, "SELECT (body->>'micro_step')::int FROM gyre_events WHERE "
                                              "event_type = 'train.contribution' AND (body->>'batch')::int = %s", batch)]  # fmt: skip
        assert sorted(counted) == list(range(micro_steps)), batch
        assert cells == [0, 1], (batch, cells)  # the satellite's gradients were reduced with the core's
    replay = gyre("sched", "replay", "--run", RUN, env={"GYRE_DATABASE_URL": url_a})
    assert_replay_clean(replay, "differ", "violations")
