"""A task's test command runs with a minimal environment, never with the evaluator's.

The evaluator holds the run's database URL and keys; the code under test is the policy's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gyre_train import CommandEvaluator, InvalidConfigError, PreservedState

# Writes the environment it was given beside the workspace, and a one-test JUnit report.
PRINT_ENV = [
    sys.executable,
    "-c",
    "import json, os, sys\n"
    "json.dump(dict(os.environ), open('env.json', 'w'))\n"
    "open(sys.argv[1], 'w').write('<testsuite><testcase classname=\"t\" name=\"env\"/></testsuite>')",
    "{report}",
]
SECRETS = {
    "GYRE_DATABASE_URL": "postgresql://gyre:secret@db/run",
    "GYRE_REDIS_URL": "redis://db:6379/0",
    "DATABASE_URL": "postgresql://app:secret@db/app",
    "REDIS_URL": "redis://db:6379/1",
    "ANTHROPIC_API_KEY": "sk-ant-secret",
    "OPENAI_API_KEY": "sk-secret",
    "PYTHONPATH": "/somewhere/else",
}


def seen_by_the_command(workspace: Path, evaluator: CommandEvaluator) -> dict[str, str]:
    state = PreservedState("e0", "run", "v1", ("refs/heads/main",), str(workspace))
    assert evaluator.evaluate(state).score == 1.0
    seen: dict[str, str] = json.loads((workspace / "env.json").read_text())
    return seen


def test_the_test_command_sees_no_secret_of_the_evaluator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "en_US.UTF-8")
    seen = seen_by_the_command(tmp_path, CommandEvaluator(PRINT_ENV, env={"TASK_SEED": "7"}))
    assert not set(SECRETS) & set(seen)
    # Only what it is given: the evaluator's PATH and locale, its own HOME and TMPDIR, the task's.
    assert set(seen) <= {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR", "TASK_SEED", "LC_CTYPE"}
    assert (seen["PATH"], seen["LANG"], seen["TASK_SEED"]) == (os.environ["PATH"], "en_US.UTF-8", "7")
    home, tmp = Path(seen["HOME"]), Path(seen["TMPDIR"])
    assert home != Path.home() and home.parent == tmp.parent and home.parent.name.startswith("gyre-eval-")
    assert not home.parent.exists()  # the scratch folder went with the evaluation


def test_a_task_may_not_be_given_gyres_settings() -> None:
    with pytest.raises(InvalidConfigError, match="GYRE_DATABASE_URL"):
        CommandEvaluator(PRINT_ENV, env={"GYRE_DATABASE_URL": "postgresql://db/run"})
