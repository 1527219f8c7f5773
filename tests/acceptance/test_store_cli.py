"""The store's commands, run the way a user runs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import pg
from tests.acceptance.conftest import gyre

# Each command's timeout, and the sum of a test's, sit under that test's pytest timeout (300 s
# unless marked): a command that hangs then fails with its own output, not with pytest's kill.
# Measured on two cores: 5 to 25 s (at a load average of 13) for one short command, most of it
# importing; 110 s for the embedded `gyre run` at a light load, 290 s at that one.
COMMAND_S = 90  # three of them fit under the default 300 s
RUN_S = 900


def _gyre(
    *args: str, timeout: float = COMMAND_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``gyre ARGS``; a timeout fails the test with the ends of what the command printed."""
    try:
        return gyre(*args, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tails = [
            (name, (out or b"")[-3000:]) for name, out in (("stdout", exc.stdout), ("stderr", exc.stderr))
        ]
        shown = "\n".join(
            f"--- {name} ---\n{out.decode(errors='replace') if isinstance(out, bytes) else out}"
            for name, out in tails
        )
        pytest.fail(f"gyre {' '.join(args)} did not finish in {timeout} s\n{shown}", pytrace=False)


def test_help_lists_every_option_with_its_environment_variable() -> None:
    out = _gyre("run", "--help")
    assert out.returncode == 0, out.stderr
    for var in ("GYRE_DATABASE_URL", "GYRE_REDIS_URL", "GYRE_DATA_DIR", "GYRE_RUN_CONFIG", "GYRE_RUN_ID"):
        assert var in out.stdout


def test_db_upgrade_and_check_on_an_empty_database() -> None:
    name = "gyre_acc_" + __import__("uuid").uuid4().hex[:8]
    with pg.admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {"GYRE_DATABASE_URL": pg.url_for(name)}
        assert _gyre("db", "check", env=env).returncode == 1  # not migrated yet
        up = _gyre("db", "upgrade", env=env)
        assert up.returncode == 0, up.stderr
        check = _gyre("db", "check", env=env)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "matches the models" in check.stdout
    finally:
        pg.drop(name)


def test_unknown_projection_is_a_clear_error(fresh_database_url: str) -> None:
    out = _gyre("projections", "rebuild", "nope", env={"GYRE_DATABASE_URL": fresh_database_url})
    assert out.returncode != 0
    assert "no projection named 'nope'" in out.stderr


@pytest.mark.timeout(RUN_S + COMMAND_S + 60)
def test_a_run_on_the_embedded_default(tmp_path: Path) -> None:
    """No database or Redis configured: `gyre run` starts embedded ones under --data-dir."""
    config = tmp_path / "run.toml"
    config.write_text(
        "steps = 1\nB = 1\nN = 2\nphi = 0.0\nrollout_engines = 1\nengine_capacity = 2\n"
        '[model]\ninit = "random"\nmax_tokens = 16\n[tasks]\ntrain = 2\nheldout = 1\n[eval]\nheldout = false\n'
    )
    data = tmp_path / "gyre-data"
    out = _gyre(
        "run",
        "--config",
        str(config),
        "--data-dir",
        str(data),
        "--json",
        str(tmp_path / "run.json"),
        "--quiet",
        timeout=RUN_S,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "embedded PostgreSQL" in out.stdout
    summary = json.loads((tmp_path / "run.json").read_text())
    assert [s["groups"] for s in summary["steps"]] == [1]
    # the same data folder again: the embedded servers come back with the log
    tail = _gyre("events", "tail", "-n", "3", "--json", "--data-dir", str(data))
    assert tail.returncode == 0, tail.stderr
    assert any(summary["run_id"] in line for line in tail.stdout.splitlines())


def test_executions_new_for_codex_prints_the_key_base_url_and_config(fresh_database_url: str) -> None:
    import tomllib

    out = _gyre(
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
