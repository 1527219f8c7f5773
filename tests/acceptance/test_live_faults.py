"""Faults on a live run, one run through all of them, on a PostgreSQL cluster of its own.

While `gyre run` trains (two rollout engines, a core and a satellite), the test kills a rollout
engine's process mid-execution, kills the satellite mid-batch, kills the controller, stops
PostgreSQL for a few seconds, and finally kills `gyre run` itself and starts it again with the
same run id. The run must finish every step, and the log must show that the harnesses saw no
model-API error, every micro-step counted exactly once, the scheduler's decisions replay
exactly, every policy version was published once, and nothing the proxy answered was lost:
the model calls the proxy noted in its answers log as it answered them (over all its lives)
and the model-call records in the store are the same, one to one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gyre_proxy.ingest.spool_files import AnswerLog
from tests import pgcluster
from tests.acceptance.conftest import ROOT, assert_replay_clean, gyre
from tests.real_servers import require

pytestmark = [
    pytest.mark.timeout(1500),
]

RUN = "faults-run"
CONFIG = """
seed = 5
steps = 4
policy = "async"
phi = 1.0
mu = 1
B = 2
N = 2
cells = 2
rollout_engines = 2
engine_capacity = 4
harness = "builtin"
[model]
init = "random"
max_tokens = 48
max_context = 512  # a row is about 414 tokens; rows are never split: at most a micro-step's budget
[train]
micro_step_tokens = 512  # one row per micro-step, four per batch: both cells claim in every batch
skip_zero_advantage = false  # an untrained policy scores 0: its rows still flow through the cells
[tasks]
train = 8
heldout = 2
budget_s = 90
[eval]
heldout = false
"""


@pytest.fixture
def cluster() -> Iterator[pgcluster.PrivateCluster]:
    require("postgres_binaries", pgcluster.missing())
    cluster = pgcluster.PrivateCluster().init()
    try:
        yield cluster
    finally:
        cluster.destroy()


def _rows(url: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
    for _ in range(50):  # the test itself stops the database for a while
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]
        except psycopg.OperationalError:
            time.sleep(0.2)
    raise AssertionError("the database did not come back")


def _logs(folder: Path) -> str:
    """The end of gyre run's output and of every process log, for a failure's message."""
    out = []
    for path in sorted(folder.rglob("*.log")):
        out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
    return "\n".join(out)


def _wait(
    what: str, probe: Callable[[], bool], run: subprocess.Popen[bytes], folder: Path, timeout_s: float = 300
) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert run.poll() is None, (
            f"gyre run ended (exit {run.returncode}) while waiting for {what}\n{_logs(folder)}"
        )
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s\n{_logs(folder)}"
        time.sleep(0.2)


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None once it is gone (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def _descendants(pid: int) -> dict[int, int]:
    """Every process below ``pid`` now, with when it started (so a reused pid is not mistaken for it)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # the name before it may hold spaces
        except OSError:
            continue  # ended meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p: start for p in found if (start := _started(p)) is not None}


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(ended)"


def _wait_gone(processes: dict[int, int], folder: Path, timeout_s: float = 120) -> None:
    """Until every one of ``processes`` (pid: start) has ended. Those that do not are asked for
    their threads' stacks (SIGUSR1), which land in their logs, shown with the failure."""
    deadline = time.monotonic() + timeout_s
    while alive := [p for p, start in processes.items() if _started(p) == start]:
        if time.monotonic() > deadline:
            commands = {p: _command(p) for p in alive}
            for pid in alive:
                if "gyre_tools.cli" in commands[pid] or "spawn_main" in commands[pid]:
                    os.kill(pid, signal.SIGUSR1)
            time.sleep(2)
            raise AssertionError(
                f"processes of the killed gyre run still alive after {timeout_s} s: {commands}\n"
                f"{_logs(folder)}"
            )
        time.sleep(0.1)


def _count(url: str, event_type: str, where: str = "") -> int:
    try:
        rows = _rows(url, f"SELECT count(*) FROM gyre_events WHERE event_type = %s {where}", event_type)
    except psycopg.errors.UndefinedTable:
        return 0  # gyre run has not migrated the database yet
    return int(rows[0][0])


def test_a_live_run_survives_its_faults(cluster: pgcluster.PrivateCluster, tmp_path: Path) -> None:
    url = cluster.url
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env.update(
        GYRE_DATABASE_URL=url,
        GYRE_REDIS_URL=os.environ.get("GYRE_TEST_REDIS", "redis://127.0.0.1:6379/0"),
        GYRE_DATA_DIR=str(tmp_path / "data"),
    )
    command = [sys.executable, "-m", "gyre_tools.cli", "run", "--config", str(config), "--run-id", RUN,
               "--json", str(tmp_path / "run.json"), "--quiet"]  # fmt: skip
    log = (tmp_path / "gyre-run.log").open("wb")
    run = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    pids = tmp_path / "data" / "runs" / RUN / "logs" / "node-0-pids.json"
    faults: list[tuple[str, float]] = []  # what was done when (wall clock), for the diagnostics
    try:
        # 1. a rollout engine's process dies while executions are running
        _wait(
            "running executions",
            lambda: _count(url, "execution.started") >= 2 and pids.exists(),
            run,
            tmp_path,
        )
        os.kill(json.loads(pids.read_text())[f"{RUN}:pool-0"], signal.SIGKILL)
        faults.append(("engine pool-0 killed", time.time()))
        # 2. the satellite dies inside a batch it took part in
        _wait(
            "a satellite claim",
            lambda: _count(url, "train.claimed", "AND (body->>'cell')::int = 1") > 0,
            run,
            tmp_path,
        )
        os.kill(json.loads(pids.read_text())["cell-1"], signal.SIGKILL)
        faults.append(("satellite killed", time.time()))
        # 3. the controller dies between two steps
        _wait("step 0 closed", lambda: _count(url, "batch.closed") >= 1, run, tmp_path)
        controller = subprocess.run(
            ["pgrep", "-f", f"controller serve --run {RUN}"], capture_output=True, text=True
        )
        for pid in controller.stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        faults.append(("controller killed", time.time()))
        # 4. PostgreSQL is down for a few seconds in the middle of a step
        _wait("step 1 started", lambda: _count(url, "batch.started") >= 2, run, tmp_path)
        cluster.stop("immediate")
        faults.append(("PostgreSQL stopped", time.time()))
        time.sleep(4)
        cluster.start()
        faults.append(("PostgreSQL started", time.time()))
        # 5. gyre run itself dies; started again with the same run id, it continues
        _wait("step 1 closed", lambda: _count(url, "batch.closed") >= 2, run, tmp_path)
        old_life = _descendants(run.pid)
        run.kill()
        run.wait(30)
        faults.append(("gyre run killed", time.time()))
        # Its processes end with it (they get SIGTERM when it dies); the next life starts only
        # once they have, as a process manager restarting it would see them.
        _wait_gone(old_life, tmp_path)
        again = gyre("run", "--config", str(config), "--run-id", RUN, "--json", str(tmp_path / "run.json"),
                     "--quiet", env={k: v for k, v in env.items() if k.startswith("GYRE_")}, timeout=900)  # fmt: skip
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert "continuing run" in again.stdout
    finally:
        if run.poll() is None:
            run.kill()
        log.close()

    summary = json.loads((tmp_path / "run.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [0, 1, 2, 3]
    assert all(s["groups"] == 2 for s in summary["steps"])
    # Every version published exactly once, in order.
    versions = [v for (v,) in _rows(url, "SELECT (body->>'policy_version')::int FROM gyre_events "
                                         "WHERE event_type = 'policy.published' ORDER BY position")]  # fmt: skip
    assert versions == [1, 2, 3, 4]
    # The killed engine was started again and registered with its new address.
    engines = Counter(
        e
        for (e,) in _rows(
            url, "SELECT body->>'engine' FROM gyre_events WHERE event_type = 'engine.registered'"
        )
    )
    assert engines[f"{RUN}:pool-0"] >= 2
    # No harness saw a model-API error: rerouting kept them served. The one exception is the
    # executions the dying launcher cancelled when gyre run itself was killed: every process of
    # the run, the proxy too, got SIGTERM at once, so a harness may have lost its model API in
    # the moment before its launcher ended it. At the run's orderly stop the launcher ends the
    # harnesses before the proxy stops (after the last publication), so those cancellations
    # must carry no error.
    killed_at = dict(faults)["gyre run killed"]
    [(last_published,)] = _rows(
        url,
        "SELECT extract(epoch from max(recorded_at)) FROM gyre_events WHERE event_type = 'policy.published'",
    )
    finished = _rows(
        url,
        "SELECT body->>'execution_id', body->>'detail', body->>'reason', extract(epoch from recorded_at) "
        "FROM gyre_events WHERE event_type = 'execution.finished'",
    )
    errors = [
        (e, float(at), d)
        for e, d, reason, at in finished
        if "model API failed" in (d or "")
        and not (
            reason == "cancelled"
            and (d or "").startswith("the launcher stopped")
            and killed_at - 30 <= float(at) < float(last_published)
        )
    ]
    assert not errors, f"harness errors {errors} after the faults {faults}\n{_logs(tmp_path)}"
    # Each micro-step of each update counted exactly once, whatever cell computed it.
    for batch, micro_steps in _rows(url, "SELECT (body->>'batch')::int, (body->>'micro_steps')::int FROM gyre_events "
                                         "WHERE event_type = 'train.update'"):  # fmt: skip
        counted = [m for (m,) in _rows(url, "SELECT (body->>'micro_step')::int FROM gyre_events WHERE "
                                            "event_type = 'train.contribution' AND (body->>'batch')::int = %s", batch)]  # fmt: skip
        assert sorted(counted) == list(range(micro_steps)), batch
    # Nothing the proxy answered was lost over the faults: each model call it noted as it staged
    # the call's record (before the harness got the end of the answer) is in the store, and the
    # store holds no call it did not note, one to one, execution by execution.
    answered = [
        (a["execution_id"], a["request_id"])
        for a in AnswerLog.read(tmp_path / "data" / "runs" / RUN / "logs" / "proxy-answers.jsonl")
    ]
    stored = _rows(url, "SELECT body->>'execution_id', body->>'request_id' FROM gyre_events "
                        "WHERE event_type = 'model_call.recorded'")  # fmt: skip
    assert answered and len(set(answered)) == len(answered)
    missing, unnoted = set(answered) - set(stored), set(stored) - set(answered)
    assert not missing and not unnoted and len(stored) == len(answered), (
        f"answered but not stored: {sorted(missing)}; stored but never answered: {sorted(unnoted)}"
    )
    assert _count(url, "record.quarantined") == 0
    completed = {e for (e,) in _rows(url, "SELECT body->>'execution_id' FROM gyre_events WHERE event_type = "
                                          "'execution.finished' AND body->>'reason' = 'completed'")}  # fmt: skip
    assert completed and completed <= {e for e, _ in answered}
    # The new controller went on from the log: the decisions replay exactly, none twice.
    replay = gyre("sched", "replay", "--run", RUN, env={"GYRE_DATABASE_URL": url})
    assert_replay_clean(replay, "differ", "violations")
    keys = [
        k
        for (k,) in _rows(url, "SELECT idempotency_key FROM gyre_events WHERE event_type = 'sched.decision'")
    ]
    assert len(keys) == len(set(keys))
