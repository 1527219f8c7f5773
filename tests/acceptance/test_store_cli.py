"""The store's commands, run the way a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from tests import pg
from tests.acceptance.conftest import gyre


def test_help_lists_every_option_with_its_environment_variable() -> None:
    out = gyre("run", "--help")
    assert out.returncode == 0, out.stderr
    for var in ("GYRE_DATABASE_URL", "GYRE_REDIS_URL", "GYRE_DATA_DIR", "GYRE_RUN_CONFIG", "GYRE_RUN_ID"):
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


def test_unknown_projection_is_a_clear_error(fresh_database_url: str) -> None:
    out = gyre("projections", "rebuild", "nope", env={"GYRE_DATABASE_URL": fresh_database_url})
    assert out.returncode != 0
    assert "no projection named 'nope'" in out.stderr


def test_a_run_on_the_embedded_default(tmp_path: Path) -> None:
    """No database or Redis configured: `gyre run` starts embedded ones under --data-dir."""
    config = tmp_path / "run.toml"
    config.write_text(
        "steps = 1\nB = 1\nN = 2\nphi = 0.0\nrollout_engines = 1\nengine_capacity = 2\n"
        '[model]\ninit = "random"\nmax_tokens = 16\n[tasks]\ntrain = 2\nheldout = 1\n[eval]\nheldout = false\n'
    )
    data = tmp_path / "gyre-data"
    out = gyre(
        "run",
        "--config",
        str(config),
        "--data-dir",
        str(data),
        "--json",
        str(tmp_path / "run.json"),
        "--quiet",
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "embedded PostgreSQL" in out.stdout
    summary = json.loads((tmp_path / "run.json").read_text())
    assert [s["groups"] for s in summary["steps"]] == [1]
    # the same data folder again: the embedded servers come back with the log
    tail = gyre("events", "tail", "-n", "3", "--json", "--data-dir", str(data))
    assert tail.returncode == 0, tail.stderr
    assert any(summary["run_id"] in line for line in tail.stdout.splitlines())


def test_executions_new_for_codex_prints_the_key_base_url_and_config(fresh_database_url: str) -> None:
    import tomllib

    out = gyre(
        "executions", "new", "--harness", "codex", "--execution-id", "cx-9", "--proxy-url", "http://127.0.0.1:8123",
        env={"GYRE_DATABASE_URL": fresh_database_url},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "base URL http://127.0.0.1:8123/v1" in out.stdout
    key = out.stdout.split("GYRE_API_KEY=", 1)[1].split()[0]
    assert key.startswith("gyre-")
    block = out.stdout.split("config.toml:", 1)[1]
    config = tomllib.loads(block)
    assert config["model_providers"]["gyre"]["base_url"] == "http://127.0.0.1:8123/v1"
    assert config["model_providers"]["gyre"]["wire_api"] == "responses"
    assert key not in block  # the key stays in the environment, never in the file
