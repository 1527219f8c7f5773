"""Sourced tasks in a run: their ``task.defined`` events by reference, workspaces written from the
source's files (refused when they changed), and preserved workspaces scored by the task's own
tests in a bwrap sandbox, with reward.json's partial credit and the verifier's timeout; a
built-in family's tests in the run's sandbox too (on the host under ``local``).

The bwrap cases fail when bubblewrap is missing; ``GYRE_TEST_SKIP_BWRAP=1`` skips them instead.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gyre_store import EvaluationStatus, PostgresEventLog, TaskDefined, TaskSplit
from gyre_train.exceptions import EvaluatorFailure, TaskSourceError
from gyre_train.rewards.evaluation import PreservedState
from gyre_train.sandbox import BwrapSandbox, LocalSandbox, bwrap_missing
from gyre_train.tasks import (
    CopiedTree,
    FileTree,
    SandboxTestEvaluator,
    TaskFiles,
    defined_tasks,
    event_task,
    open_source,
    tree_hash,
)
from gyre_train.tasks.builtin import read_builtin
from tests.real_servers import require

HARBOR = Path(__file__).resolve().parents[2] / "fixtures" / "harbor"


@pytest.fixture
def area() -> Iterator[Path]:
    """A folder the sandbox's unprivileged user can reach (pytest's tmp_path is private)."""
    path = Path(tempfile.mkdtemp(prefix="gyre-runtime-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bwrap() -> BwrapSandbox:
    require("BWRAP", bwrap_missing())
    return BwrapSandbox()


def test_sourced_tasks_are_recorded_by_reference_with_their_hash_and_budget() -> None:
    events = defined_tasks(str(HARBOR), "r1", train=1, heldout=1, seed=0, budget_s=60.0)
    tasks = {t.id: t for t in open_source(str(HARBOR)).tasks}
    assert sorted(e.task_id for e in events) == sorted(tasks)
    for event in events:
        task = tasks[event.task_id]
        assert event.files == {} and event.tests == {}  # nothing embedded in the event
        assert event.source == str(HARBOR)
        assert event.content_hash == task.workspace_hash and event.content_hash.startswith("sha256:")
        assert event.budget_s == task.agent_timeout_s == 60.0
        assert event.workdir == task.workdir
        assert event.prompt == task.prompt


def test_heldout_ids_hold_a_task_out_and_an_unknown_id_is_refused() -> None:
    events = defined_tasks(
        str(HARBOR), "r1", train=1, heldout=1, seed=0, budget_s=60.0, heldout_ids=["fix-add"]
    )
    split = {e.task_id: e.split for e in events}
    assert split["fix-add"] is TaskSplit.HELDOUT
    assert TaskSplit.TRAIN in split.values()
    with pytest.raises(TaskSourceError, match="'no-such-task'"):
        defined_tasks(
            str(HARBOR), "r1", train=1, heldout=1, seed=0, budget_s=60.0, heldout_ids=["no-such-task"]
        )
    with pytest.raises(TaskSourceError, match="no training task"):
        defined_tasks(
            str(HARBOR),
            "r1",
            train=1,
            heldout=1,
            seed=0,
            budget_s=60.0,
            heldout_ids=["fix-add", "binary-digest", "write-greeting"],
        )


def test_builtin_tasks_still_carry_their_files() -> None:
    events = defined_tasks("builtin:copy-line", "r1", train=2, heldout=1, seed=0, budget_s=30.0)
    assert len(events) == 3 and all(e.files and e.tests and not e.source for e in events)


def test_a_workspace_is_written_from_the_source_files_byte_for_byte(area: Path) -> None:
    [event] = [
        e
        for e in defined_tasks(str(HARBOR), "r1", train=1, heldout=1, seed=0, budget_s=1.0)
        if e.task_id == "binary-digest"
    ]
    files = TaskFiles()
    files.write_workspace(event, area / "ws")
    task = files.task(event)
    assert tree_hash(area / "ws") == event.content_hash
    written = sorted(p.relative_to(area / "ws").as_posix() for p in (area / "ws").rglob("*") if p.is_file())
    assert written == task.workspace.names()
    sources = {p.name: p for p in (HARBOR / "binary-digest" / "environment").rglob("*") if p.is_file()}
    for name in written:
        original = sources[Path(name).name]
        assert (area / "ws" / name).read_bytes() == original.read_bytes()


def test_a_workspace_whose_files_changed_since_the_run_recorded_them_is_refused(area: Path) -> None:
    source = area / "tasks"
    shutil.copytree(HARBOR, source)
    [event] = [
        e
        for e in defined_tasks(str(source), "r1", train=1, heldout=1, seed=0, budget_s=1.0)
        if e.task_id == "fix-add"
    ]
    (source / "fix-add" / "environment" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    with pytest.raises(TaskSourceError, match="changed since the run recorded them"):
        TaskFiles().write_workspace(event, area / "ws")


def _preserved(area: Path, task_id: str, *, solved: bool) -> tuple[PreservedState, TaskFiles, TaskDefined]:
    [event] = [
        e
        for e in defined_tasks(str(HARBOR), "r1", train=1, heldout=1, seed=0, budget_s=1.0)
        if e.task_id == task_id
    ]
    files = TaskFiles()
    workspace = area / f"{task_id}-{'solved' if solved else 'untouched'}"
    files.write_workspace(event, workspace)
    workspace.chmod(0o755)
    if solved:
        subprocess.run(["bash", str(HARBOR / task_id / "solution" / "solve.sh")], cwd=workspace, check=True)
    return PreservedState("e1", "r1", "v1", (), str(workspace)), files, event


def test_partial_credit_comes_from_reward_json_in_the_sandbox(area: Path, bwrap: BwrapSandbox) -> None:
    state, files, event = _preserved(area, "fix-add", solved=False)
    before = tree_hash(Path(state.location))
    result = SandboxTestEvaluator(files.task(event), bwrap).evaluate(state)
    assert result.status is EvaluationStatus.VALID
    assert result.score == 0.5, result.detail  # sub is right, add is not: one part of two
    assert "reward.json" in result.detail
    assert tree_hash(Path(state.location)) == before  # the tests ran on a copy
    solved, files, event = _preserved(area, "fix-add", solved=True)
    assert SandboxTestEvaluator(files.task(event), bwrap).evaluate(solved).score == 1.0


def test_tests_that_overrun_the_verifier_timeout_leave_the_evaluation_pending(
    area: Path, bwrap: BwrapSandbox
) -> None:
    state, files, event = _preserved(area, "fix-add", solved=True)
    task = files.task(event)
    tests = area / "slow-tests"
    tests.mkdir()
    (tests / "test.sh").write_text("#!/bin/bash\nsleep 30\necho 1 > /logs/verifier/reward.txt\n")
    (tests / "test.sh").chmod(0o755)
    slow = replace(task, tests=CopiedTree(((tests, "."),)), verifier_timeout_s=1.0)
    with pytest.raises(EvaluatorFailure, match="timed out after 1 s"):
        SandboxTestEvaluator(slow, bwrap).evaluate(state)


def test_a_missing_workspace_is_not_evaluable(area: Path, bwrap: BwrapSandbox) -> None:
    _, files, event = _preserved(area, "fix-add", solved=False)
    result = SandboxTestEvaluator(files.task(event), bwrap).evaluate(
        PreservedState("e1", "r1", "v1", (), str(area / "gone"))
    )
    assert result.status is EvaluationStatus.NOT_EVALUABLE and result.score is None


def test_a_jsonl_task_is_written_and_scored_by_its_exit_status_on_the_host(area: Path) -> None:
    source = Path(__file__).resolve().parents[2] / "fixtures" / "tasks.jsonl"
    [event] = [
        e
        for e in defined_tasks(str(source), "r1", train=1, heldout=1, seed=0, budget_s=1.0)
        if e.task_id == "upper"
    ]
    files = TaskFiles()
    workspace = area / "upper"
    files.write_workspace(event, workspace)
    evaluator = SandboxTestEvaluator(files.task(event), LocalSandbox())
    state = PreservedState("e1", "r1", "v1", (), str(workspace))
    untouched = evaluator.evaluate(state)
    assert (untouched.score, untouched.detail.split(" in ")[0]) == (0.0, "tests exited 1")
    (workspace / "upper.txt").write_text("GYRE\n")
    assert evaluator.evaluate(state).score == 1.0
    assert evaluator.name == "tests:local"


def test_a_builtin_familys_tests_run_in_the_runs_sandbox_and_under_local_on_the_host(
    area: Path, bwrap: BwrapSandbox, pg_log: PostgresEventLog
) -> None:
    from gyre_tools.run_config import parse_config
    from gyre_tools.serve import sourced_evaluators

    [event] = defined_tasks("builtin:copy-line", "r1", train=1, heldout=0, seed=0, budget_s=30.0)
    [task] = [t for t in read_builtin("builtin:copy-line", train=1, heldout=0) if t.id == event.task_id]
    assert isinstance(task.workspace, FileTree) and dict(event.files) == task.workspace.files
    evaluator_for, _ = sourced_evaluators(parse_config('[sandbox]\nkind = "bwrap"\n'), pg_log)
    evaluator = evaluator_for(event)
    assert isinstance(evaluator, SandboxTestEvaluator) and evaluator.name == "tests:bwrap"
    scores = {}
    for solved in (False, True):
        workspace = area / f"ws-{solved}"
        event_task(event).workspace.materialize(workspace)
        if solved:
            assert task.solution is not None
            task.solution.materialize(area / "solution")
            shutil.copytree(area / "solution" / "files", workspace, dirs_exist_ok=True)
        workspace.chmod(0o755)
        result = evaluator.evaluate(PreservedState("e1", "r1", "v1", (), str(workspace)))
        assert (
            result.status is EvaluationStatus.VALID
            and result.detail.endswith(" s")
            and " in bwrap" in result.detail
        )
        scores[solved] = result.score
    assert scores == {False: 0.0, True: 1.0}
    # under local, the worker's own command evaluator runs them on the host, as before
    local_for, _ = sourced_evaluators(parse_config('[sandbox]\nkind = "local"\n'), pg_log)
    assert local_for(event) is None
