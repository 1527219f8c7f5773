"""The three scheduling policies live, on one workload and one budget of four model hosts:
elastic and colocate with three cells that move between rollout and training and a pool
engine, async with one trainer cell beside three pool engines.

Each is a `gyre run` on real processes (an untrained policy: the machinery is what these tests
hold). Under elastic and colocate the log must show transitions both ways in every burst,
with executions in flight moved off each cell that left rollout and no harness error; the
decisions replay exactly with no invariant broken (transitions serial, core first, eq. (2) at
every move to training, counters consistent with the log); every micro-step counts once.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.conftest import assert_replay_clean, gyre
from tests.acceptance.processes import gyre_run, live_run_env

pytestmark = pytest.mark.timeout(1200)  # live runs of real processes

SHAPE = {
    # cells move: three cells of 4 executions each, and one pool engine of 4
    "elastic": "cells = 3\nrollout_engines = 1",
    "colocate": "cells = 3\nrollout_engines = 1",
    # a fixed partition of the same four hosts: one trainer cell, three pool engines
    "async": "cells = 1\nrollout_engines = 3",
}

CONFIG = """
seed = 7
steps = 4
phi = 1.0
mu = 2
B = 4
N = 2
{shape}
engine_capacity = 4
tau_s = 0.0  # the supply check must hold for no time: executions here last seconds, not hours
harness = "builtin"
[model]
init = "random"
max_tokens = 32
max_context = 2048
[train]
micro_step_tokens = 2048  # a row is never split: at least the longest context
skip_zero_advantage = false  # an untrained policy scores 0: its rows still flow through the cells
[tasks]
train = 8
heldout = 2
budget_s = 150
[eval]
heldout = false
"""


@dataclass(frozen=True)
class Run:
    policy: str
    database_url: str
    summary: dict[str, Any]
    folder: Path


@pytest.fixture(scope="module", params=["elastic", "colocate", "async"])
def run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, acceptance_template: str
) -> Any:
    from tests import pg

    policy = str(request.param)
    folder = tmp_path_factory.mktemp(policy)
    (folder / "run.toml").write_text(CONFIG.format(shape=SHAPE[policy]))  # the policy comes from --policy
    with pg.database_from(acceptance_template) as url:
        gyre_run(folder, live_run_env(url, folder / "data"), "--policy", policy)
        yield Run(policy, url, json.loads((folder / "run.json").read_text()), folder)


def _rows(url: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]


def test_every_step_trains_and_every_version_is_published_once(run: Run) -> None:
    assert run.summary["policy"] == run.policy  # gyre run --policy over the config's default
    assert [s["step"] for s in run.summary["steps"]] == [0, 1, 2, 3]
    assert all(s["groups"] == 4 for s in run.summary["steps"])
    versions = [v for (v,) in _rows(run.database_url, "SELECT (body->>'policy_version')::int FROM gyre_events "
                                                      "WHERE event_type = 'policy.published' ORDER BY position")]  # fmt: skip
    assert versions == [2, 4]  # one publication per burst of mu = 2
    for batch, micro_steps in _rows(run.database_url, "SELECT (body->>'batch')::int, (body->>'micro_steps')::int "
                                                      "FROM gyre_events WHERE event_type = 'train.update'"):  # fmt: skip
        counted = _rows(run.database_url, "SELECT (body->>'micro_step')::int FROM gyre_events WHERE "
                                          "event_type = 'train.contribution' AND (body->>'batch')::int = %s", batch)  # fmt: skip
        assert sorted(m for (m,) in counted) == list(range(micro_steps)), batch


def test_cells_move_both_ways_in_every_burst_under_the_moving_policies(run: Run) -> None:
    times = run.summary["transition_times"]
    if run.policy == "async":
        assert run.summary["transitions"] == 0 and times == []
        assert all(s["roles"] == {"training": 1} for s in run.summary["steps"])
        return
    assert run.summary["transitions"] == len(times) > 0
    assert all(t["total_s"] is not None for t in times), times  # every transition completed
    core = [t["direction"] for t in times if t["cell"] == 0]
    # Eq. (3) cannot hold here (w + mu N B = w + 16 > C_s + (K - 1) C_e = 12): the core returns
    # at every burst end, so it goes to training and back once per burst.
    assert core == ["to_training", "to_rollout"] * 2
    if run.policy == "colocate":  # the unit switches together: every cell, every burst
        assert Counter((t["cell"], t["direction"]) for t in times) == {
            (c, d): 2 for c in range(3) for d in ("to_training", "to_rollout")
        }
    for t in times:
        phases = {"drain_s", "reroute_s", "release_s", "restore_s", "join_s"}
        if t["direction"] == "to_rollout":
            phases = {"release_training_s", "restore_rollout_s"}
        assert phases <= set(t), t
    assert any(s["roles"].get("training", 0) >= 1 for s in run.summary["steps"])
    assert Path(run.summary["plots"]["roles"]).is_file()


def test_executions_keep_their_model_api_through_the_transitions(run: Run) -> None:
    url = run.database_url
    moved = _rows(url, "SELECT count(*) FROM gyre_events WHERE event_type = 'execution.rerouted'")[0][0]
    if run.policy != "async":
        assert moved > 0  # executions were in flight on a cell when it left rollout
    finished = _rows(
        url,
        "SELECT body->>'execution_id', body->>'reason', body->>'detail' FROM gyre_events "
        "WHERE event_type = 'execution.finished'",
    )
    errors = [f for f in finished if "model API failed" in (f[2] or "")]
    assert not errors, errors
    assert len(finished) >= 4 * 4 * 2  # at least every consumed group's executions ended


def test_the_decisions_replay_exactly_with_no_invariant_broken(run: Run) -> None:
    run_id = run.summary["run_id"]
    replay = gyre("sched", "replay", "--run", run_id, env={"GYRE_DATABASE_URL": run.database_url})
    assert_replay_clean(replay)
