"""The Slurm recipe (deploy/slurm/gyre-node.sh) run as srun would run it, on two namespace hosts.

Node 0 is the test's own namespace, at the bridge's address: PostgreSQL and Redis listen there,
and the per-node script with ``SLURM_NODEID=0`` runs ``gyre run``. Node 1 is a namespace host
(tests/netns.py) running the same script with ``SLURM_NODEID=1``: it must wait for the run's
configuration, start a node agent with engine ``pool-1`` and the satellite cell (the config's
``trainers = "0"`` leaves cell 1 to the other nodes) and a launcher, and stop them by itself
once node 0's ``gyre run`` has ended. Each node's address comes from ``GYRE_NODE_ADDRESS``, as a
cluster without resolvable node names would set it. No Slurm daemon is involved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import netns
from tests.acceptance.conftest import ROOT

pytestmark = [pytest.mark.timeout(600)]

NODE_SCRIPT = ROOT / "deploy" / "slurm" / "gyre-node.sh"
RUN = "slurm-run"
CONFIG = """
seed = 5
steps = 2
policy = "async"
mu = 1
B = 2
N = 2
cells = 2
trainers = "0"  # the core on node 0; the satellite, cell 1, on node 1
rollout_engines = 1  # on node 0; node 1 gets as many
engine_capacity = 4
harness = "builtin"
[model]
init = "random"
max_tokens = 48
max_context = 512
[train]
micro_step_tokens = 512
skip_zero_advantage = false
[tasks]
train = 4
heldout = 2
budget_s = 90
[eval]
heldout = false
"""


def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return conn.execute(sql).fetchall()  # type: ignore[arg-type]


def _first(url: str, event_type: str) -> float | None:
    """Seconds since the epoch of the first event of ``event_type``, or None."""
    try:
        [(at,)] = _rows(url, f"SELECT extract(epoch from min(recorded_at)) FROM gyre_events "
                             f"WHERE event_type = '{event_type}'")  # fmt: skip
    except psycopg.Error:
        return None  # not migrated yet
    return None if at is None else float(at)


def _output(*paths: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in paths if p.exists())


def test_the_slurm_node_script_runs_a_run_over_two_nodes(
    hosts: netns.Network, hosts_database: str, hosts_redis: str, tmp_path: Path
) -> None:
    node1 = hosts.add_host("n1")
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GYRE_", "SLURM"))}
    job = {
        # The venv's `gyre` and `python3`, as a cluster image would have them on PATH.
        "PATH": f"{Path(sys.executable).parent}:{base.get('PATH', '/usr/bin:/bin')}",
        "GYRE_RUN_CONFIG": str(config),
        "GYRE_RUN_ID": RUN,
        "GYRE_DATABASE_URL": hosts_database,
        "GYRE_REDIS_URL": hosts_redis,
        "GYRE_DATA_DIR": str(tmp_path / "data"),
        "GYRE_RUN_JSON": str(tmp_path / "run.json"),
        "GYRE_LAUNCHER_MAX_RUNNING": "1",  # each launcher one harness at a time: node 1's gets work
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node[0-1]",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS": "2",
    }
    nodes = {
        0: (hosts.gateway, lambda argv: argv),
        1: (node1.address, node1.command),
    }
    logs = {i: tmp_path / f"node-{i}.out" for i in nodes}
    opened = []
    scripts: dict[int, subprocess.Popen[bytes]] = {}
    started = time.monotonic()
    try:
        for i, (address, where) in nodes.items():
            env = base | job | {
                "SLURM_NODEID": str(i), "SLURM_PROCID": str(i), "SLURM_LOCALID": "0",
                "SLURMD_NODENAME": f"node{i}", "GYRE_NODE_ADDRESS": address,
            }  # fmt: skip
            out = logs[i].open("wb")
            opened.append(out)
            scripts[i] = subprocess.Popen(
                where(["bash", str(NODE_SCRIPT)]), cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            scripts[0].wait(420)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node 0's gyre run did not finish within 420 s\n{_output(*logs.values())}")
        run_ended = time.monotonic()
        assert scripts[0].returncode == 0, _output(*logs.values())
        # Node 1 stops its node agent and launcher by itself once node 0's run has ended.
        try:
            scripts[1].wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node 1's script went on after the run ended\n{_output(*logs.values())}")
        node1_ended = time.monotonic()
        assert scripts[1].returncode == 0, _output(*logs.values())
    finally:
        for script in scripts.values():
            if script.poll() is None:
                script.terminate()
                script.wait(60)
        for out in opened:
            out.close()

    node1_log = logs[1].read_text(errors="replace")
    assert "engines 1 from 1, trainers 1, launcher node1" in node1_log, node1_log
    summary = json.loads((tmp_path / "run.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [0, 1]
    # Node 1's engine registered its own address and answered model calls.
    registered = dict(_rows(hosts_database, "SELECT body->>'engine', body->>'url' FROM gyre_events "
                                      "WHERE event_type = 'engine.registered'"))  # fmt: skip
    assert registered[f"{RUN}:pool-1"].startswith(f"http://{node1.address}:"), registered
    engines = dict(_rows(hosts_database, "SELECT body->>'engine', count(*) FROM gyre_events WHERE event_type = "
                                   "'model_call.recorded' AND body->>'finish' IN ('stop', 'length') GROUP BY 1"))  # fmt: skip
    assert engines.get(f"{RUN}:pool-1", 0) >= 1, engines
    # Node 1's launcher started executions, under its Slurm node name.
    launchers = dict(_rows(hosts_database, "SELECT body->>'launcher', count(*) FROM gyre_events "
                                     "WHERE event_type = 'execution.started' GROUP BY 1"))  # fmt: skip
    assert launchers.get("node1", 0) >= 1, launchers
    # The satellite on node 1 joined the core's batches.
    joined = _rows(hosts_database, "SELECT (body->>'batch')::int FROM gyre_events "
                             "WHERE event_type = 'train.cell_joined' AND (body->>'cell')::int = 1")  # fmt: skip
    assert sorted(b for (b,) in joined) == [0, 1], _output(*logs.values())

    t0 = time.time() - (time.monotonic() - started)
    seconds = {
        what: at - t0
        for what in ("run.configured", "engine.registered", "model_call.recorded", "batch.closed")
        if (at := _first(hosts_database, what)) is not None
    }
    print(
        "slurm recipe on two namespace nodes, seconds from the start: "
        + ", ".join(f"first {what} {s:.1f}" for what, s in seconds.items())
        + f", gyre run ended {run_ended - started:.1f}, node 1 stopped {node1_ended - run_ended:.1f} s after"
    )
    print(f"launchers: {launchers}; engines: {engines}")
