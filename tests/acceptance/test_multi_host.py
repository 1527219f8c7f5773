"""A live run over three hosts, made of network namespaces (tests/netns.py), one of them lost.

Host A is the test's own namespace, at the bridge's address: it runs PostgreSQL, Redis and
`gyre run` (the proxy, a launcher, the evaluator, the controller, and a node agent with one
rollout engine and the core cell, all listening on every address and advertising A's). Hosts
B and C are namespaces of their own, reaching A only at its address on the bridge (their
127.0.0.1 is their own): B runs `gyre node serve` with an engine and the satellite (cell 1)
and a launcher; C runs `gyre node serve` with an engine and a launcher. The satellite finds the
core's torch.distributed rendezvous in the log (``trainer.world_started``), reads the core's
weights from A's memory over Mooncake (at the address the core recorded), claims micro-steps
from Redis on A and reduces its gradients with the core over gloo, between the hosts. Once a
step has closed and C runs executions, C's link goes down: the run must still train every
step, with no execution lost (C's are finished by A's or B's launcher once C's launcher key
expires), each micro-step counted once, and the scheduler's decisions replaying exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import netns
from tests.acceptance.conftest import ROOT, assert_replay_clean, gyre

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
rollout_engines = 1  # on host A; B and C run one each
engine_capacity = 4
harness = "builtin"
[model]
init = "random"
max_tokens = 48
max_context = 512  # a row is about 414 tokens
[train]
micro_step_tokens = 512  # one row per micro-step: four per batch, for both cells to claim
skip_zero_advantage = false  # an untrained policy scores 0: its rows still flow through the cells
weight_transport = "mooncake"  # the satellite on B reads the core's weights from A's memory
[tasks]
train = 6
heldout = 2
budget_s = 90
[eval]
heldout = false
"""


def _rows(url: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]


def _logs(*folders: Path) -> str:
    out = []
    for folder in folders:
        for path in sorted(folder.rglob("*.log")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2500:]}")
    return "\n".join(out)


def _wait(
    what: str, probe: Callable[[], bool], run: subprocess.Popen[bytes], folders: tuple[Path, ...]
) -> None:
    deadline = time.monotonic() + 300
    while True:
        try:
            if probe():
                return
        except psycopg.Error:
            pass  # not migrated yet
        assert run.poll() is None, (
            f"gyre run ended (exit {run.returncode}) waiting for {what}\n{_logs(*folders)}"
        )
        assert time.monotonic() < deadline, f"no {what} within 300 s\n{_logs(*folders)}"
        time.sleep(0.3)


def _count(url: str, sql: str) -> int:
    return int(_rows(url, sql)[0][0])


def test_a_run_over_three_hosts_trains_and_survives_one_host_lost(
    hosts: netns.Network, hosts_database: str, hosts_redis: str, tmp_path: Path
) -> None:
    b, c = hosts.add_host("b"), hosts.add_host("c")
    url_a = hosts_database
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    base = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    shared = {
        "GYRE_DATABASE_URL": url_a,
        "GYRE_REDIS_URL": hosts_redis,
        "GYRE_DATA_DIR": str(tmp_path / "data"),
    }
    # Host A: gyre run. Its node's engine and core cell, and its proxy, listen on every address
    # and advertise A's; its launcher runs one harness at a time, so that B and C take the rest.
    env_a = base | shared | {
        "GYRE_NODE_HOST": "0.0.0.0", "GYRE_NODE_ADVERTISE_HOST": hosts.gateway,
        "GYRE_PROXY_HOST": "0.0.0.0", "GYRE_PROXY_ADVERTISE_HOST": hosts.gateway,
        "GYRE_LAUNCHER_MAX_RUNNING": "1",
    }  # fmt: skip
    folders = (tmp_path, tmp_path / "host-b", tmp_path / "host-c")
    for folder in folders[1:]:
        folder.mkdir()
    gyre_cli = [sys.executable, "-m", "gyre_tools.cli"]
    started = time.monotonic()
    opened: list[Any] = []
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, argv: list[str], env: dict[str, str], folder: Path) -> None:
        out = (folder / f"{name}.log").open("wb")
        opened.append(out)
        processes[name] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    start("gyre-run", [*gyre_cli, "run", "--config", str(config), "--run-id", RUN, "--json",
                       str(tmp_path / "run.json"), "--quiet"], env_a, tmp_path)  # fmt: skip
    run = processes["gyre-run"]
    faults: dict[str, float] = {}
    try:
        _wait("the run's config", lambda: _count(url_a, CONFIGURED) > 0, run, folders)
        for host, name, engines, trainers in ((b, "b", "1", "1"), (c, "c", "2", "none")):
            where = ["--host", "0.0.0.0", "--advertise-host", host.address]
            start(f"node-{name}", host.command([*gyre_cli, "node", "serve", "--run", RUN, "--engines", "1",
                                                "--engine-offset", engines, "--trainers", trainers, *where]),
                  base | shared, tmp_path / f"host-{name}")  # fmt: skip
            start(f"launcher-{name}", host.command([*gyre_cli, "launcher", "serve", "--run", RUN,
                                                    "--name", f"host-{name}"]),
                  base | shared, tmp_path / f"host-{name}")  # fmt: skip
        # Host C serves model calls and runs harnesses; then its link goes down mid-run.
        _wait("a step closed", lambda: _count(url_a, CLOSED) >= 1, run, folders)
        _wait("executions on host C", lambda: _count(url_a, STARTED_ON % "host-c") >= 1, run, folders)
        c.link_down()
        faults["host C cut off"] = time.monotonic()
        cut_at = time.time()
        try:
            run.wait(600)
        except subprocess.TimeoutExpired:
            pytest.fail(f"gyre run did not finish within 600 s\n{_logs(*folders)}")
        assert run.returncode == 0, _logs(*folders)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        for process in processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:  # host C's, cut off from the store it closes
                process.kill()
                process.wait(30)
        for out in opened:
            out.close()
    ended = time.monotonic()
    print(
        f"multi-host run: {ended - started:.1f} s; host C cut off {faults['host C cut off'] - started:.1f} s in"
    )
    print((tmp_path / "gyre-run.log").read_text(errors="replace")[-1200:])

    # Where host C's executions went: how each ended, and when, from the moment it was cut off.
    on_c = _rows(
        url_a,
        "SELECT f.body->>'execution_id', f.body->>'reason', f.body->>'detail', extract(epoch from f.recorded_at) "
        "FROM gyre_events f JOIN gyre_events s ON s.body->>'execution_id' = f.body->>'execution_id' "
        "WHERE f.event_type = 'execution.finished' AND s.event_type = 'execution.started' "
        "AND s.body->>'launcher' = 'host-c' ORDER BY 4",
    )
    for execution, reason, detail, at in on_c:
        print(f"host C's {execution}: {reason} {float(at) - cut_at:+.1f} s after the cut ({detail[:80]})")
    summary = json.loads((tmp_path / "run.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [0, 1, 2]
    # Executions ran on every host, and each host's engines served model calls.
    launchers = dict(_rows(url_a, "SELECT body->>'launcher', count(*) FROM gyre_events "
                                  "WHERE event_type = 'execution.started' GROUP BY 1"))  # fmt: skip
    assert {"host-b", "host-c"} <= set(launchers), launchers
    engines = dict(_rows(url_a, "SELECT body->>'engine', count(*) FROM gyre_events WHERE event_type = "
                                "'model_call.recorded' AND body->>'finish' IN ('stop', 'length') GROUP BY 1"))  # fmt: skip
    assert {f"{RUN}:pool-1", f"{RUN}:pool-2"} <= set(engines), engines
    registered = dict(_rows(url_a, "SELECT body->>'engine', body->>'url' FROM gyre_events "
                                   "WHERE event_type = 'engine.registered'"))  # fmt: skip
    assert registered[f"{RUN}:pool-1"].startswith(f"http://{b.address}:"), registered
    assert registered[f"{RUN}:pool-2"].startswith(f"http://{c.address}:"), registered
    # No execution lost: every one started has finished, once.
    started_ids = [e for (e,) in _rows(url_a, "SELECT body->>'execution_id' FROM gyre_events "
                                              "WHERE event_type = 'execution.started'")]  # fmt: skip
    finished = Counter(e for (e,) in _rows(url_a, "SELECT body->>'execution_id' FROM gyre_events "
                                                  "WHERE event_type = 'execution.finished'"))  # fmt: skip
    assert set(finished) >= set(started_ids) and max(finished.values()) == 1, finished
    # The core's world is recorded with A's address; the satellite on B joined every batch.
    [(dist_init,)] = _rows(
        url_a, "SELECT body->>'dist_init' FROM gyre_events WHERE event_type = 'trainer.world_started'"
    )
    assert dist_init.startswith(f"tcp://{hosts.gateway}:"), dist_init
    joined = _rows(url_a, "SELECT (body->>'batch')::int, body->>'transport' FROM gyre_events "
                          "WHERE event_type = 'train.cell_joined' AND (body->>'cell')::int = 1")  # fmt: skip
    assert sorted(batch for (batch, _) in joined) == [0, 1, 2], _logs(*folders)
    # It pulled the core's weights on joining (batch 0) over Mooncake, from A's address: each
    # cell's Transfer Engine is recorded at its own machine's advertised address.
    assert {transport for (_, transport) in joined} == {"mooncake"}, joined
    segments = dict(_rows(url_a, "SELECT (body->>'cell')::int, body->>'segment' FROM gyre_events "
                                 "WHERE event_type = 'trainer.transport_started'"))  # fmt: skip
    assert segments[0].startswith(f"{hosts.gateway}:") and segments[1].startswith(f"{b.address}:"), segments
    kv_hosts = dict(_rows(url_a, "SELECT body->>'engine', body->>'kv_transfer_host' FROM gyre_events "
                                 "WHERE event_type = 'engine.registered'"))  # fmt: skip
    assert (kv_hosts[f"{RUN}:pool-1"], kv_hosts[f"{RUN}:pool-2"]) == (b.address, c.address), kv_hosts
    # Each micro-step counted exactly once, and the satellite's gradients reduced with the core's.
    for batch, micro_steps, cells in _rows(
        url_a,
        "SELECT (body->>'batch')::int, (body->>'micro_steps')::int, body->'cells' FROM gyre_events "
        "WHERE event_type = 'train.update'",
    ):
        counted = [m for (m,) in _rows(url_a, "SELECT (body->>'micro_step')::int FROM gyre_events WHERE "
                                              "event_type = 'train.contribution' AND (body->>'batch')::int = %s", batch)]  # fmt: skip
        assert sorted(counted) == list(range(micro_steps)), batch
        assert cells == [0, 1], (batch, cells)
    by_cell = _rows(
        url_a, "SELECT DISTINCT (body->>'cell')::int FROM gyre_events WHERE event_type = 'train.contribution'"
    )
    assert {cell for (cell,) in by_cell} == {0, 1}, by_cell
    # C_s followed the pool engines that registered (A's 4, then B's and C's: 12) and answer
    # (C's lost with its host: 8); the configured pool was A's alone (4).
    capacities = [c for (c,) in _rows(url_a, "SELECT (body->'input'->>'capacity')::int FROM gyre_events WHERE "
                                             "event_type = 'sched.input' AND body->'input'->>'type' = "
                                             "'PoolCapacityChanged' ORDER BY position")]  # fmt: skip
    assert 12 in capacities and capacities[-1] == 8, capacities
    replay = gyre("sched", "replay", "--run", RUN, env={"GYRE_DATABASE_URL": url_a})
    assert_replay_clean(replay, "differ", "violations")


CONFIGURED = "SELECT count(*) FROM gyre_events WHERE event_type = 'run.configured'"
CLOSED = "SELECT count(*) FROM gyre_events WHERE event_type = 'batch.closed'"
STARTED_ON = (
    "SELECT count(*) FROM gyre_events WHERE event_type = 'execution.started' AND body->>'launcher' = '%s'"
)
