"""``gyre tasks check`` the way a user runs it: the shipped Harbor task set in bwrap and in podman, a
broken task that passes untouched, a Harbor task refused by ``local``, docker refused in one line
when no engine answers, and ``list``/``show``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gyre_train.sandbox import bwrap_missing, podman_missing
from tests.acceptance.conftest import gyre
from tests.real_servers import require

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / "tests" / "fixtures" / "harbor"


def test_check_the_shipped_harbor_set_in_bwrap(tmp_path: Path) -> None:
    require("bwrap", bwrap_missing())
    out = tmp_path / "check.json"
    done = gyre("tasks", "check", str(HARBOR), "--sandbox", "bwrap", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert (report["sandbox"], report["failed"]) == ("bwrap", 0)
    assert [t["task"] for t in report["tasks"]] == ["binary-digest", "fix-add", "write-greeting"]
    for task in report["tasks"]:
        assert task["untouched"] < 1.0 <= task["solved"], task
        assert task["verdict"] == "ok"
    assert next(t for t in report["tasks"] if t["task"] == "fix-add")["untouched"] == 0.5  # reward.json
    assert "write-greeting" in done.stdout and "ok" in done.stdout


def _broken_set(tmp_path: Path) -> Path:
    """The shipped set plus a task whose tests pass on the untouched workspace and one with no
    solution."""
    root = tmp_path / "set"
    shutil.copytree(HARBOR, root)
    passes = root / "passes-untouched"
    shutil.copytree(HARBOR / "write-greeting", passes)
    (passes / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\n"
    )
    unsolved = root / "unsolved"
    shutil.copytree(HARBOR / "binary-digest", unsolved)
    shutil.rmtree(unsolved / "solution")
    root.chmod(0o755)
    return root


def test_a_task_passing_untouched_fails_the_check(tmp_path: Path) -> None:
    require("bwrap", bwrap_missing())
    out = tmp_path / "check.json"
    done = gyre("tasks", "check", str(_broken_set(tmp_path)), "--sandbox", "bwrap", "--json", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    tasks = {t["task"]: t for t in json.loads(out.read_text())["tasks"]}
    assert tasks["passes-untouched"]["verdict"] == "fail"
    assert tasks["passes-untouched"]["untouched"] == 1.0
    assert "pass on the untouched workspace" in tasks["passes-untouched"]["detail"]
    assert tasks["unsolved"]["verdict"] == "no solution"
    assert tasks["write-greeting"]["verdict"] == "ok"
    assert "FAIL passes-untouched" in done.stdout


def test_local_refuses_harbor_tasks_and_points_to_bwrap(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    done = gyre("tasks", "check", str(HARBOR / "fix-add"), "--sandbox", "local", "--json", str(out))
    assert done.returncode == 1
    (task,) = json.loads(out.read_text())["tasks"]
    assert task["verdict"] == "fail" and "use --sandbox bwrap" in task["detail"]


def test_jsonl_and_builtin_sources_pass_under_local() -> None:
    for source in (str(ROOT / "tests" / "fixtures" / "tasks.jsonl"), "builtin:copy-line"):
        done = gyre("tasks", "check", source, "--sandbox", "local")
        assert done.returncode == 0, done.stdout + done.stderr


def test_check_the_shipped_harbor_set_in_podman(tmp_path: Path) -> None:
    require("podman", podman_missing())
    out = tmp_path / "check.json"
    done = gyre("tasks", "check", str(HARBOR), "--sandbox", "podman", "--json", str(out), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert (report["sandbox"], report["failed"]) == ("podman", 0)
    assert all(t["untouched"] < 1.0 <= t["solved"] for t in report["tasks"]), report


def test_docker_without_an_engine_is_refused_in_one_line(tmp_path: Path) -> None:
    dead = f"unix://{tmp_path}/no-engine.sock"
    done = gyre("tasks", "check", str(HARBOR), "--sandbox", "docker", env={"DOCKER_HOST": dead})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no Docker engine answers at {dead}" in lines[0], done.stderr


def test_list_and_show(tmp_path: Path) -> None:
    listed = gyre("tasks", "list", str(HARBOR))
    assert listed.returncode == 0, listed.stderr
    assert all(name in listed.stdout for name in ("binary-digest", "fix-add", "write-greeting", "sha256:"))
    shown = gyre("tasks", "show", str(HARBOR), "fix-add")
    assert shown.returncode == 0, shown.stderr
    assert "/srv/project" in shown.stdout and "calc.py" in shown.stdout and "python:3.11-slim" in shown.stdout
    missing = gyre("tasks", "show", str(HARBOR), "nope")
    assert missing.returncode == 2 and "no task 'nope'" in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1\n')
    broken = gyre("tasks", "list", str(bad))
    assert broken.returncode == 2 and f"{bad}:1: bad JSON" in broken.stderr
    assert len(broken.stderr.strip().splitlines()) == 1
