"""A live run, the way a user runs it: `gyre run --config` on real processes, then the log it
leaves audited with the other commands (replay of the scheduler, projections, SQL views).

One small run (an untrained policy, so rewards are 0: the machinery, not learning, is what
these tests hold) serves every test of the module.
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
from tests.wandb_files import history, key_of, whole_records

pytestmark = pytest.mark.timeout(1200)  # a live run of real processes

CONFIG = """
seed = 3
steps = 2
policy = "async"
phi = 1.0
mu = 1
B = 2
N = 2
cells = 1
rollout_engines = 2
engine_capacity = 4
nodes = 2  # two node agents on this machine, one engine each, as two machines would run them
harness = "builtin"
[model]
init = "random"
max_tokens = 32
[tasks]
train = 8
heldout = 3
budget_s = 150  # generous: a loaded machine slows the first answer, never the audit
"""


@dataclass(frozen=True)
class Run:
    database_url: str
    env: dict[str, str]
    summary: dict[str, Any]
    stdout: str
    folder: Path


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory, acceptance_template: str) -> Any:
    from tests import pg

    folder = tmp_path_factory.mktemp("live")
    (folder / "run.toml").write_text(CONFIG)
    with pg.database_from(acceptance_template) as url:
        env = live_run_env(url, folder / "data", WANDB_SILENT="true")
        out = gyre_run(folder, env, "--metrics", "tensorboard,wandb")
        summary = json.loads((folder / "run.json").read_text())
        caught_up = gyre("projections", "catch-up", env=env)  # every projection, as an auditor would
        assert caught_up.returncode == 0, caught_up.stderr
        yield Run(url, env, summary, out.stdout, folder)


def _events(url: str, run_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT position, event_type, body FROM gyre_events WHERE body->>'run_id' LIKE %s ORDER BY position",
            (run_id + "%",),
        ).fetchall()
    return [(int(p), str(t), dict(b)) for p, t, b in rows]


def test_the_run_json_has_every_documented_figure(live_run: Run) -> None:
    s = live_run.summary
    assert s["policy"] == "async" and (s["phi"], s["mu"], s["B"], s["N"]) == (1.0, 1, 2, 2)
    assert [step["step"] for step in s["steps"]] == [0, 1]
    for step in s["steps"]:
        assert step["groups"] == 2 and step["executions"] == 4
        assert step["policy_version"] == step["step"] + 1
        assert step["mean_reward"] is not None and 0.0 <= step["mean_reward"] <= 1.0
        assert step["admitted_trajectories"] >= 1 and step["trainable_tokens"] > 0 and step["wall_s"] > 0
    assert s["eval"]["tasks"] == 3
    assert s["eval"]["pass_rate_before"] is not None and s["eval"]["pass_rate_after"] is not None
    assert s["staleness"]["expected_mean"] == 1.0 and s["staleness"]["groups"] == 4
    assert s["transitions"] == 0 and s["wall_s"] > 0
    for plot in s["plots"].values():
        assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(Path(s["tensorboard"]).glob("events.out.tfevents.*"))
    # --metrics tensorboard,wandb: each step went to W&B as well, offline (W&B not configured).
    assert s["wandb"]["mode"] == "offline"
    [run_file] = Path(s["wandb"]["dir"]).glob("offline-run-*/run-*.wandb")
    records = whole_records(run_file)
    logged = history(records)
    assert sorted(logged) == [0, 1]
    for step in s["steps"]:
        assert float(logged[step["step"]]["reward/mean"]) == pytest.approx(step["mean_reward"])
    summary = {
        key_of(i): i.value_json
        for r in records
        if r.WhichOneof("record_type") == "summary"
        for i in r.summary.update
    }
    assert float(summary["eval/pass_rate_after"]) == pytest.approx(s["eval"]["pass_rate_after"])
    # Where the cells' time went: one trainer cell and two engines, each split in full.
    cells = s["cell_time"]
    assert 0.0 < cells["trainer_useful_fraction"] < 1.0
    assert 0.0 < cells["engine_generating_fraction"] < 1.0
    assert [c["name"].split()[0] for c in cells["cells"]] == ["trainer", "engine", "engine"]
    for c in cells["cells"]:
        parts = sum(v for k, v in c.items() if k not in ("name", "span_s"))
        assert parts == pytest.approx(c["span_s"], abs=0.05)


def test_every_fact_is_written_by_the_component_that_knows_it(live_run: Run) -> None:
    run_id = live_run.summary["run_id"]
    events = _events(live_run.database_url, run_id)
    kinds = Counter(t for _, t, _ in events)
    # Dispatch (controller's sink), lifecycle (launcher), model calls (proxy), evaluations
    # (evaluator worker), batches and publications (trainer), engines (engine processes).
    for kind in ("group.dispatched", "execution.start_requested", "execution.started", "execution.finished",
                 "model_call.recorded", "evaluation.recorded", "reward.assigned", "group.ready",
                 "batch.started", "batch.group_claimed", "batch.closed", "policy.published", "engine.registered",
                 "train.computed"):  # fmt: skip
        assert kinds[kind] > 0, kind
    assert kinds["policy.published"] == 2
    # Both node agents served: each registered its engine.
    engines = {b["engine"] for _, t, b in events if t == "engine.registered"}
    assert engines == {f"{run_id}:pool-0", f"{run_id}:pool-1"}
    finished = [b for _, t, b in events if t == "execution.finished" and b["run_id"] == run_id]
    started = {b["execution_id"] for _, t, b in events if t == "execution.started" and b["run_id"] == run_id}
    assert {b["execution_id"] for b in finished} <= started  # nothing finishes that did not start
    # Staleness from the log: each consumed group's step minus its dispatch version.
    dispatched = {b["group_id"]: b["policy_version"] for _, t, b in events if t == "group.dispatched"}
    stale = [b["step"] - dispatched[b["group_id"]] for _, t, b in events if t == "group.consumed"]
    assert sum(stale) / len(stale) == live_run.summary["staleness"]["measured_mean"]
    # And per model call, from the version the engine reported for its sampled tokens.
    groups = {b["execution_id"]: b["group_id"] for _, t, b in events if t == "execution.dispatched"}
    step_of = {b["group_id"]: b["step"] for _, t, b in events if t == "group.consumed"}
    by_engine = [
        step_of[groups[b["execution_id"]]] - min(v for _, v in b["weight_versions"])
        for _, t, b in events
        if t == "model_call.recorded"
        and groups.get(b["execution_id"]) in step_of
        and b.get("weight_versions")
    ]
    assert by_engine and sum(by_engine) / len(by_engine) == live_run.summary["staleness"]["engine_mean"]
    assert live_run.summary["staleness"]["unreported_calls"] == 0


def test_the_scheduler_replays_the_live_run_exactly(live_run: Run) -> None:
    out = gyre("sched", "replay", "--run", live_run.summary["run_id"], env=live_run.env)
    assert_replay_clean(out)


def test_every_reward_a_step_used_is_traceable_to_its_evaluation_in_sql(live_run: Run) -> None:
    run_id = live_run.summary["run_id"]
    with psycopg.connect(live_run.database_url) as conn:
        rows = conn.execute(
            "SELECT step, execution_id, evaluation_id, evaluator, artifact_version FROM gyre_step_rewards_v "
            "WHERE run_id = %s",
            (run_id,),
        ).fetchall()
    assert sorted(Counter(step for step, *_ in rows).items()) == [(0, 4), (1, 4)]  # B * N per step
    assert all(evaluation_id and evaluator and artifact for _, _, evaluation_id, evaluator, artifact in rows)


def test_tail_rebuild_and_replay_on_the_runs_log(live_run: Run) -> None:
    env = live_run.env
    tail = gyre("events", "tail", "-n", "5", "--json", env=env)
    assert tail.returncode == 0, tail.stderr
    lines = [json.loads(line) for line in tail.stdout.splitlines() if line.startswith("{")]
    assert [x["position"] for x in lines] == sorted(x["position"] for x in lines) and len(lines) == 5
    with psycopg.connect(live_run.database_url) as conn:
        before = conn.execute("SELECT * FROM gyre_executions ORDER BY execution_id").fetchall()
    rebuilt = gyre("projections", "rebuild", env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    with psycopg.connect(live_run.database_url) as conn:
        assert conn.execute("SELECT * FROM gyre_executions ORDER BY execution_id").fetchall() == before
    middle = _events(live_run.database_url, live_run.summary["run_id"])[len(before)][0]
    replay = gyre("replay", "--until", str(middle), "--schema", "as_of_middle", env=env)
    assert replay.returncode == 0, replay.stderr
    with psycopg.connect(live_run.database_url) as conn:
        (then,) = conn.execute("SELECT count(*) FROM as_of_middle.gyre_executions").fetchone()  # type: ignore[misc]
    assert then < len(before)
