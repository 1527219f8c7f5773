"""Task sources read without running anything: Harbor folders, JSONL files, builtin families;
their one-line errors, splits, content hashes and materialized workspaces (binary files too)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from gyre_store import TaskSplit
from gyre_train.exceptions import SandboxError, TaskSourceError
from gyre_train.sandbox import Bind, Limits, RunResult, Sandbox, sandbox_for
from gyre_train.tasks import held_out, open_source, read_reward, refusal, tree_hash

ROOT = Path(__file__).resolve().parents[3]
HARBOR = ROOT / "tests" / "fixtures" / "harbor"
JSONL = ROOT / "tests" / "fixtures" / "tasks.jsonl"


class _NamespaceKind(Sandbox):
    """Stands in for a sandbox that can move folders (``refusal`` only reads kind and remaps)."""

    kind = "bwrap"
    remaps = True
    python = "python3"

    def run(
        self,
        command: Sequence[str],
        *,
        workdir: str,
        binds: Sequence[Bind] = (),
        env: Mapping[str, str] | None = None,
        timeout_s: float,
        limits: Limits = Limits(),  # noqa: B008
    ) -> RunResult:
        raise AssertionError("refusal runs nothing")


def _harbor_copy(tmp_path: Path, name: str = "write-greeting") -> Path:
    dest = tmp_path / "set" / name
    shutil.copytree(HARBOR / name, dest)
    return dest


def _error(spec: Path | str) -> str:
    with pytest.raises(TaskSourceError) as caught:
        open_source(str(spec))
    message = str(caught.value)
    assert "\n" not in message
    return message


# Harbor folders


def test_harbor_fixture_reads_every_field() -> None:
    source = open_source(str(HARBOR))
    assert source.kind == "harbor"
    assert [t.id for t in source.tasks] == ["binary-digest", "fix-add", "write-greeting"]
    greeting = source.task("write-greeting")
    assert greeting.prompt.startswith("Write the line `hello, gyre`")
    assert (greeting.agent_timeout_s, greeting.verifier_timeout_s) == (60.0, 30.0)
    assert (greeting.resources.cpus, greeting.resources.memory_mb) == (1.0, 1024)
    assert greeting.image == "debian:bookworm-slim" and greeting.workdir == "/app"
    assert dict(greeting.env) == {"GREETING_FILE": "greeting.txt"}
    assert greeting.workspace.names() == ["notes/README.txt"]
    assert greeting.tests.names() == ["test.sh"] and greeting.solution is not None
    assert greeting.metadata["category"] == "file-io"
    fix = source.task("fix-add")
    assert fix.workdir == "/srv/project" and fix.image == "python:3.11-slim"
    assert (fix.resources.memory_mb, fix.resources.storage_mb) == (1024, 64)
    assert fix.workspace.names() == ["calc.py"]
    digest = source.task("binary-digest")
    assert digest.dockerfile is None and digest.workspace.names() == ["data.bin"]


def test_one_task_folder_is_a_source_of_one() -> None:
    assert [t.id for t in open_source(str(HARBOR / "fix-add")).tasks] == ["fix-add"]


def test_materialize_copies_binary_files_byte_for_byte(tmp_path: Path) -> None:
    task = open_source(str(HARBOR)).task("binary-digest")
    task.materialize(tmp_path / "ws")
    original = (HARBOR / "binary-digest" / "environment" / "data.bin").read_bytes()
    assert (tmp_path / "ws" / "data.bin").read_bytes() == original
    assert b"\x00\xff\xfe" in original  # not valid UTF-8: a text-only workspace could not hold it


def test_workspace_hash_is_the_materialized_content_and_follows_changes(tmp_path: Path) -> None:
    folder = _harbor_copy(tmp_path)
    first = open_source(str(folder)).tasks[0]
    first.materialize(tmp_path / "ws")
    assert first.workspace_hash == tree_hash(tmp_path / "ws")
    assert open_source(str(folder)).tasks[0].workspace_hash == first.workspace_hash  # stable
    (folder / "environment" / "README.txt").write_text("changed\n")
    assert open_source(str(folder)).tasks[0].workspace_hash != first.workspace_hash
    (folder / "environment" / "README.txt").write_text("Nothing to see here yet.\n")
    (folder / "environment" / "README.txt").chmod(0o755)  # the executable bit is content too
    assert open_source(str(folder)).tasks[0].workspace_hash != first.workspace_hash


def test_harbor_split_follows_the_hash_rule() -> None:
    for task in open_source(str(HARBOR)).tasks:
        expected = TaskSplit.HELDOUT if held_out("harbor", task.id) else TaskSplit.TRAIN
        assert task.split is expected


def test_unknown_top_level_key_names_file_and_key(tmp_path: Path) -> None:
    folder = _harbor_copy(tmp_path)
    with (folder / "task.toml").open("a") as f:
        f.write('\n[sandbox]\nkind = "x"\n')
    message = _error(tmp_path / "set")
    assert f"{folder / 'task.toml'}: unknown key 'sandbox'" in message


def test_missing_instruction_is_named(tmp_path: Path) -> None:
    folder = _harbor_copy(tmp_path)
    (folder / "instruction.md").unlink()
    assert f"{folder / 'instruction.md'}: missing" in _error(tmp_path / "set")


def test_test_sh_must_exist_and_be_executable(tmp_path: Path) -> None:
    folder = _harbor_copy(tmp_path)
    (folder / "tests" / "test.sh").chmod(0o644)
    assert f"{folder / 'tests' / 'test.sh'}: not executable" in _error(folder)
    (folder / "tests" / "test.sh").unlink()
    assert f"{folder / 'tests' / 'test.sh'}: missing" in _error(folder)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("[agent]\ntimeout_sec = -1", "[agent] timeout_sec"),
        ('[verifier]\ntimeout_sec = "long"', "[verifier] timeout_sec"),
        ('[environment]\nmemory = "lots"', "[environment] memory"),
        ("[environment]\nmemory_mb = 0", "[environment] memory_mb"),
        ("metadata = 3", "[metadata]"),
    ],
)
def test_bad_task_toml_values_name_the_field(tmp_path: Path, line: str, field: str) -> None:
    folder = _harbor_copy(tmp_path, "binary-digest")
    (folder / "task.toml").write_text(line + "\n")
    message = _error(folder)
    assert str(folder / "task.toml") in message and field in message


def test_memory_sizes_in_megabytes(tmp_path: Path) -> None:
    folder = _harbor_copy(tmp_path, "binary-digest")
    for raw, mb in (('"2G"', 2048), ('"512M"', 512), ('"1.5Gi"', 1536), ("1048576", 1)):
        (folder / "task.toml").write_text(f"[environment]\nmemory = {raw}\n")
        assert open_source(str(folder)).tasks[0].resources.memory_mb == mb


def test_dockerfile_other_instructions_are_kept_with_line_and_refused_under_bwrap(tmp_path: Path) -> None:
    folder = _harbor_copy(tmp_path, "fix-add")
    (folder / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim\n# a comment\nWORKDIR /srv/project\nRUN pip install \\\n  requests\nCOPY calc.py .\n"
    )
    task = open_source(str(folder)).tasks[0]
    assert task.unsupported == ((4, "RUN"),)
    assert task.workspace.names() == ["calc.py"]
    why = refusal(task, _NamespaceKind())
    assert why is not None
    assert f"{folder / 'environment' / 'Dockerfile'}:4: RUN" in why and "podman or docker" in why


def test_harbor_tasks_are_refused_by_local_pointing_to_bwrap() -> None:
    task = open_source(str(HARBOR)).task("write-greeting")
    why = refusal(task, sandbox_for("local"))
    assert why is not None and "--sandbox bwrap" in why
    assert refusal(task, _NamespaceKind()) is None


@pytest.mark.parametrize(
    ("dockerfile", "expected"),
    [
        ("WORKDIR /app\nCOPY calc.py /etc/calc.py\n", "outside the final WORKDIR /app"),
        ("ADD https://example.com/x.py .\n", ":1: ADD https://example.com/x.py: only local files"),
        ("COPY --from=build /x .\n", ":1: COPY flags"),
        ("COPY missing.py .\n", ":1: COPY missing.py: not found"),
        ("COPY *.py .\n", "wildcards"),
    ],
)
def test_dockerfile_errors_name_the_line(tmp_path: Path, dockerfile: str, expected: str) -> None:
    folder = _harbor_copy(tmp_path, "fix-add")
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    message = _error(folder)
    assert str(folder / "environment" / "Dockerfile") in message and expected in message


def test_copy_into_folders_follows_docker(tmp_path: Path) -> None:
    folder = _harbor_copy(tmp_path, "fix-add")
    env = folder / "environment"
    (env / "pkg").mkdir()
    (env / "pkg" / "mod.py").write_text("X = 1\n")
    (env / "Dockerfile").write_text(
        "WORKDIR /w\nCOPY calc.py lib/\nCOPY pkg src/pkg\nCOPY calc.py main.py\nENV A=1 B=two\n"
    )
    task = open_source(str(folder)).tasks[0]
    assert task.workspace.names() == ["lib/calc.py", "main.py", "src/pkg/mod.py"]
    assert dict(task.env) == {"A": "1", "B": "two"} and task.workdir == "/w"
    task.materialize(tmp_path / "ws")
    assert (tmp_path / "ws" / "src" / "pkg" / "mod.py").read_text() == "X = 1\n"


def test_empty_folder_is_not_a_source(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "no task folder" in _error(tmp_path / "empty")
    assert "no such folder or file" in _error(tmp_path / "nowhere")


# JSONL files


def test_jsonl_fixture_reads_tasks_with_their_splits() -> None:
    source = open_source(str(JSONL))
    upper, count = source.tasks
    assert (upper.id, upper.split, count.split) == ("upper", TaskSplit.TRAIN, TaskSplit.HELDOUT)
    assert upper.test_command[:2] == ("sh", "-c") and upper.agent_timeout_s == 30.0
    assert count.test_command == ("{python}", "{tests}/check.py")
    assert count.tests.names() == ["check.py"] and count.workspace.names() == ["notes/list.txt"]
    assert not upper.fixed_paths


def _jsonl(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


GOOD = {"id": "a", "prompt": "p", "files": {"x.txt": "x"}, "test_command": "true", "budget_s": 5}


def test_jsonl_without_split_uses_the_hash_rule(tmp_path: Path) -> None:
    rows = [GOOD | {"id": f"t{i}"} for i in range(40)]
    tasks = open_source(str(_jsonl(tmp_path, *rows))).tasks
    for task in tasks:
        assert task.split is (TaskSplit.HELDOUT if held_out("tasks", task.id) else TaskSplit.TRAIN)
    assert {t.split for t in tasks} == {TaskSplit.TRAIN, TaskSplit.HELDOUT}


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ('{"id": "a", "prompt": ', ":2: bad JSON"),
        (GOOD | {"image": "x"}, ":2: unknown key 'image'"),
        ({k: v for k, v in GOOD.items() if k != "prompt"}, ":2: prompt: missing"),
        (GOOD | {"budget_s": 0}, ":2: budget_s"),
        (GOOD | {"split": "test"}, ":2: split"),
        (GOOD | {"test_command": []}, ":2: test_command"),
        (GOOD | {"files": {"../up.txt": "x"}}, ":2: files: path '../up.txt'"),
        (GOOD | {"id": "first"}, ":2: id 'first' repeats"),
        ({k: v for k, v in GOOD.items() if k != "files"}, ":2: files: missing"),
        (GOOD | {"repo": "nowhere", "commit": "abc"}, ":2: files: give files, or repo and commit, not both"),
    ],
)
def test_bad_jsonl_lines_name_file_line_and_field(tmp_path: Path, row: object, expected: str) -> None:
    path = _jsonl(tmp_path, GOOD | {"id": "first"}, row)
    assert f"{path}{expected}" in _error(path)


def _git(repo: Path, *args: str) -> str:
    env = os.environ | {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def test_jsonl_repo_at_a_commit_is_cloned_at_that_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "main.py").write_text("v1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "main.py").write_text("v2\n")
    _git(repo, "commit", "-qam", "two")
    row = {k: v for k, v in GOOD.items() if k != "files"} | {"repo": "repo", "commit": first}
    task = open_source(str(_jsonl(tmp_path, row))).tasks[0]
    task.materialize(tmp_path / "ws")
    assert (tmp_path / "ws" / "main.py").read_text() == "v1\n"
    assert task.workspace_hash == f"git-tree:{_git(repo, 'rev-parse', first + '^{tree}')}"
    assert task.workspace.names() == ["main.py"]
    missing = open_source(str(_jsonl(tmp_path, row | {"commit": "0" * 40}))).tasks[0]
    with pytest.raises(TaskSourceError, match="not found"):
        _ = missing.workspace_hash


def test_jsonl_repo_must_be_a_git_repository(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    row = {k: v for k, v in GOOD.items() if k != "files"} | {"repo": "plain", "commit": "HEAD"}
    assert "repo:" in _error(_jsonl(tmp_path, row))


# builtin families


def test_builtin_family_yields_train_and_heldout_tasks_with_a_solution(tmp_path: Path) -> None:
    source = open_source("builtin:copy-line")
    splits = [t.split for t in source.tasks]
    assert splits.count(TaskSplit.TRAIN) == 8 and splits.count(TaskSplit.HELDOUT) == 2
    task = source.tasks[0]
    assert task.id == "copy-line-train-0" and task.workspace.names() == ["input.txt"]
    assert task.solution is not None and task.solution.names() == ["files/answer.txt"]
    task.solution.materialize(tmp_path / "solution")
    task.materialize(tmp_path / "ws")
    assert (tmp_path / "solution" / "files" / "answer.txt").read_text() == (
        tmp_path / "ws" / "input.txt"
    ).read_text()


def test_unknown_builtin_family_is_named() -> None:
    message = _error("builtin:nope")
    assert message.endswith("builtin:nope: unknown builtin family 'nope'; known: copy-line")


# rewards and sandbox kinds


def test_reward_files(tmp_path: Path) -> None:
    assert read_reward(tmp_path, junit=False, exit_code=1, required=True)[0] is None
    assert read_reward(tmp_path, junit=False, exit_code=0, required=False)[0] == 1.0
    assert read_reward(tmp_path, junit=False, exit_code=3, required=False)[0] == 0.0
    (tmp_path / "reward.json").write_text('{"a": 1, "b": 0}')
    assert read_reward(tmp_path, junit=False, exit_code=0, required=True)[0] == 0.5
    (tmp_path / "reward.json").write_text('{"a": 1, "b": 0, "reward": 0.25}')
    assert read_reward(tmp_path, junit=False, exit_code=0, required=True)[0] == 0.25
    (tmp_path / "reward.json").write_text('{"a": "high"}')
    assert read_reward(tmp_path, junit=False, exit_code=0, required=True)[0] is None
    (tmp_path / "reward.txt").write_text(" 0.75\n")  # reward.txt wins over reward.json
    assert read_reward(tmp_path, junit=False, exit_code=0, required=True)[0] == 0.75
    (tmp_path / "reward.txt").write_text("yes")
    assert read_reward(tmp_path, junit=False, exit_code=0, required=True) == (
        None,
        "reward.txt holds 'yes', not a number",
    )


def test_unknown_sandbox_kind() -> None:
    with pytest.raises(SandboxError, match="unknown sandbox kind 'vm'"):
        sandbox_for("vm")


def test_a_rubric_is_read_from_the_task_and_never_written_to_the_workspace(tmp_path: Path) -> None:
    tasks = {t.id: t for t in open_source(str(HARBOR)).tasks}
    assert tasks["write-greeting"].rubric == (HARBOR / "write-greeting" / "rubric.md").read_text()
    assert tasks["fix-add"].rubric == ""
    tasks["write-greeting"].materialize(tmp_path / "ws")
    assert not list((tmp_path / "ws").rglob("rubric.md"))
    line = {
        "id": "t",
        "prompt": "p",
        "files": {"a": "b"},
        "test_command": "true",
        "budget_s": 5,
        "rubric": "r",
    }
    (tmp_path / "t.jsonl").write_text(json.dumps(line) + "\n")
    [task] = open_source(str(tmp_path / "t.jsonl")).tasks
    assert task.rubric == "r"
    (tmp_path / "t.jsonl").write_text(json.dumps(line | {"rubric": 3}) + "\n")
    with pytest.raises(TaskSourceError, match=r"t\.jsonl:1: rubric: must be text"):
        open_source(str(tmp_path / "t.jsonl"))


def test_a_sandboxed_command_holds_no_gyre_setting_but_its_execution_key() -> None:
    from gyre_train.sandbox.base import minimal_env

    env = minimal_env("/home/agent", {"GYRE_API_KEY": "gyre-k", "TASK": "1"})
    assert (env["GYRE_API_KEY"], env["TASK"], env["HOME"]) == ("gyre-k", "1", "/home/agent")
    with pytest.raises(SandboxError, match=r"gyre's own settings: \['GYRE_DATABASE_URL'\]"):
        minimal_env("/home/agent", {"GYRE_API_KEY": "gyre-k", "GYRE_DATABASE_URL": "postgresql://x"})
