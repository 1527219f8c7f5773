"""Faults in the middle of live role transitions, one elastic run through all of them.

The core's process is killed in the middle of its drain (its engine refusing new requests,
its requests in flight being moved), then again while it restores its training state, and the
controller is killed right after recording a transition's first protocol step, before the
rest. Each is a real process dying at that point (``GYRE_FAULT``, gyre_store.faults): no
cleanup. The run must finish every step; the decisions replay exactly with no invariant
broken; no execution is lost and no harness saw a model-API error; every micro-step of every
update counts exactly once; every version is published once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.conftest import assert_replay_clean, gyre
from tests.acceptance.processes import gyre_run, live_run_env

pytestmark = pytest.mark.timeout(1500)

CONFIG = """
seed = 11
steps = 4
policy = "elastic"
phi = 1.0
mu = 2
B = 4
N = 2
cells = 3
rollout_engines = 1
engine_capacity = 4
tau_s = 0.0
harness = "builtin"
[model]
init = "random"
max_tokens = 32
max_context = 2048
[train]
micro_step_tokens = 2048
skip_zero_advantage = false
[tasks]
train = 8
heldout = 2
budget_s = 150
[eval]
heldout = false
"""

FAULTS = ("cell-0:reroute", "cell-0:restore", "controller:stop_accepting")


def _rows(url: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]


def test_an_elastic_run_survives_deaths_inside_its_transitions(
    tmp_path: Path, acceptance_template: str
) -> None:
    from tests import pg

    (tmp_path / "run.toml").write_text(CONFIG)
    markers = {point: tmp_path / f"fired-{point.replace(':', '-')}" for point in FAULTS}
    with pg.database_from(acceptance_template) as url:
        faults = ",".join(f"{point}@{marker}" for point, marker in markers.items())
        out = gyre_run(tmp_path, live_run_env(url, tmp_path / "data", GYRE_FAULT=faults), timeout=1200)
        logs = "".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}\n"
            for p in sorted(tmp_path.rglob("*.log"))
        )
        # Every fault fired: each process died where it was told to.
        assert {p for p, m in markers.items() if m.exists()} == set(FAULTS), logs
        assert "the controller process exited 137" in out.stdout, out.stdout[-3000:]

        summary = json.loads((tmp_path / "run.json").read_text())
        assert [s["step"] for s in summary["steps"]] == [0, 1, 2, 3]
        versions = [v for (v,) in _rows(url, "SELECT (body->>'policy_version')::int FROM gyre_events "
                                             "WHERE event_type = 'policy.published' ORDER BY position")]  # fmt: skip
        assert versions == [2, 4]
        # The transitions the deaths interrupted were completed: every one of them has its end.
        assert summary["transitions"] >= 4 and all(
            t["total_s"] is not None for t in summary["transition_times"]
        )
        # Each micro-step of each update counted exactly once, whichever incarnation computed it.
        for batch, micro_steps in _rows(url, "SELECT (body->>'batch')::int, (body->>'micro_steps')::int "
                                             "FROM gyre_events WHERE event_type = 'train.update'"):  # fmt: skip
            counted = _rows(url, "SELECT (body->>'micro_step')::int FROM gyre_events WHERE "
                                 "event_type = 'train.contribution' AND (body->>'batch')::int = %s", batch)  # fmt: skip
            assert sorted(m for (m,) in counted) == list(range(micro_steps)), batch
        # No execution lost: every one started finished, and no harness saw its model API fail.
        started = {e for (e,) in _rows(url, "SELECT body->>'execution_id' FROM gyre_events "
                                            "WHERE event_type = 'execution.started'")}  # fmt: skip
        finished = _rows(url, "SELECT body->>'execution_id', body->>'detail' FROM gyre_events "
                              "WHERE event_type = 'execution.finished'")  # fmt: skip
        assert started == {e for e, _ in finished}
        assert not [f for f in finished if "model API failed" in (f[1] or "")], finished
        # The decisions replay exactly, none recorded twice, no invariant broken.
        replay = gyre("sched", "replay", "--run", summary["run_id"], env={"GYRE_DATABASE_URL": url})
        assert_replay_clean(replay, "differ", "violations")
        keys = [
            k
            for (k,) in _rows(
                url, "SELECT idempotency_key FROM gyre_events WHERE event_type = 'sched.decision'"
            )
        ]
        assert len(keys) == len(set(keys))
