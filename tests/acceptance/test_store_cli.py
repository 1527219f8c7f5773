"""The store's commands, run the way a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from tests import pg
from tests.acceptance.conftest import gyre


def test_help_lists_every_option_with_its_environment_variable() -> None:
    out = gyre("demo", "--help")
    assert out.returncode == 0, out.stderr
    for var in ("GYRE_DATABASE_URL", "GYRE_REDIS_URL", "GYRE_DATA_DIR", "GYRE_DEMO_SEED"):
        assert var in out.stdout


def test_db_upgrade_and_check_on_an_empty_database() -> None:
    name = "gyre_acc_" + __import__("uuid").uuid4().hex[:8]
    with pg.admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {"GYRE_DATABASE_URL": pg.url_for(name)}
        assert gyre("db", "check", env=env).returncode == 1  # not migrated yet
        up = gyre("db", "upgrade", env=env)
        assert up.returncode == 0, up.stderr
        check = gyre("db", "check", env=env)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "matches the models" in check.stdout
    finally:
        pg.drop(name)


def test_demo_then_tail_rebuild_and_replay(fresh_database_url: str) -> None:
    env = {"GYRE_DATABASE_URL": fresh_database_url}
    demo = gyre("demo", "--groups", "2", "--group-size", "3", "--no-serving", env=env)
    assert demo.returncode == 0, demo.stderr
    assert "waterlevel" in demo.stdout and "replay as of position" in demo.stdout

    tail = gyre("events", "tail", "-n", "5", "--json", env=env)
    assert tail.returncode == 0, tail.stderr
    lines = [json.loads(line) for line in tail.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 5
    assert [x["position"] for x in lines] == sorted(x["position"] for x in lines)

    with psycopg.connect(fresh_database_url) as conn:
        before = conn.execute("SELECT * FROM gyre_executions ORDER BY execution_id").fetchall()
    rebuilt = gyre("projections", "rebuild", env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    with psycopg.connect(fresh_database_url) as conn:
        assert conn.execute("SELECT * FROM gyre_executions ORDER BY execution_id").fetchall() == before

    replay = gyre("replay", "--until", "10", "--schema", "as_of_ten", env=env)
    assert replay.returncode == 0, replay.stderr
    with psycopg.connect(fresh_database_url) as conn:
        (started_then,) = conn.execute("SELECT sum(started) FROM as_of_ten.gyre_counters").fetchone()  # type: ignore[misc]
        (live,) = conn.execute("SELECT sum(started) FROM gyre_counters").fetchone()  # type: ignore[misc]
    assert started_then < live


def test_unknown_projection_is_a_clear_error(fresh_database_url: str) -> None:
    out = gyre("projections", "rebuild", "nope", env={"GYRE_DATABASE_URL": fresh_database_url})
    assert out.returncode != 0
    assert "no projection named 'nope'" in out.stderr


def test_demo_runs_on_the_embedded_default(tmp_path: Path) -> None:
    out = gyre("demo", "--data-dir", str(tmp_path / "gyre-data"))
    assert out.returncode == 0, out.stderr
    assert "embedded PostgreSQL" in out.stdout
    assert "gyre_waterlevel_v" in out.stdout
    flat = " ".join(out.stdout.split())  # rich wraps long lines
    assert "tool_use Bash" in flat  # executions went through the proxy
    assert "the engine now reports weight version '1'" in flat
    # a second run reuses the same data folder
    again = gyre("demo", "--no-training", "--no-serving", "--data-dir", str(tmp_path / "gyre-data"))
    assert again.returncode == 0, again.stderr
