"""Tasks from a source in a live run: their ``task.defined`` events, the workspaces written from
the task's own files, and the evaluation of a preserved workspace by the task's tests in a sandbox.

A built-in family's events carry their files, as they always have (``event_task`` makes the
task a sandbox runs the tests of from them). A task read from a Harbor
folder or a JSONL file is recorded by reference: the event names the source, the task and the
content hash of its starting workspace; the launcher writes each workspace from the source's
files (binary files and git checkouts included) and refuses files whose hash changed since the
run recorded them. The tests run in the preserved workspace's copy, in the run's sandbox, with
the environment the task declares and nothing of the run's (no database or Redis URL).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from gyre_store import EvaluationStatus, TaskDefined, TaskSplit
from gyre_train.exceptions import EvaluatorFailure, GyreTrainError, TaskSourceError
from gyre_train.rewards.evaluation import EvaluationResult, PreservedState
from gyre_train.sandbox import Bind, Sandbox
from gyre_train.tasks.builtin import PREFIX
from gyre_train.tasks.check import LOGS, TESTS, limits_for, read_reward, refusal, sandbox_for_task
from gyre_train.tasks.families import task_suite
from gyre_train.tasks.sources import open_source
from gyre_train.tasks.task import FileTree, GitCheckout, Task, tree_hash

BUILTIN = PREFIX


def defined_tasks(
    spec: str,
    run_id: str,
    *,
    train: int,
    heldout: int,
    seed: int,
    budget_s: float,
    heldout_ids: Collection[str] = (),
) -> list[TaskDefined]:
    """The run's ``task.defined`` events for the source ``spec``.

    ``builtin:<family>``: ``train`` and ``heldout`` instances drawn from ``seed``, files in the
    events. A Harbor folder or a JSONL file: every task of the source, split by the source's own
    split (a JSONL ``split``; else the hash rule), except that ``heldout_ids`` are held out; each
    execution's budget is the task's own agent timeout. Raises TaskSourceError (one line, file
    and field named) on bad input, and when a task of ``heldout_ids`` is not in the source.
    """
    if spec.startswith(BUILTIN):
        if heldout_ids:
            raise TaskSourceError(f"{spec}: heldout_ids applies to a folder or .jsonl source, not a family")
        name = spec.removeprefix(BUILTIN)
        return task_suite(name, run_id, train=train, heldout=heldout, seed=seed, budget_s=budget_s)
    source = open_source(spec)
    known = {t.id for t in source.tasks}
    if missing := sorted(set(heldout_ids) - known):
        raise TaskSourceError(f"{spec}: heldout_ids names {missing[0]!r}, which the source does not hold")
    events: list[TaskDefined] = []
    for task in source.tasks:
        split = TaskSplit.HELDOUT if task.id in heldout_ids else task.split
        events.append(
            TaskDefined(
                run_id=run_id,
                task_id=task.id,
                split=split,
                prompt=task.prompt,
                test_command=task.test_command,
                budget_s=task.agent_timeout_s,
                family=source.kind,
                source=spec,
                content_hash=task.workspace_hash,
                workdir=task.workdir,
            )
        )
    if not any(e.split is TaskSplit.TRAIN for e in events):
        raise TaskSourceError(f"{spec}: no training task (every task is held out)")
    return events


class TaskFiles:
    """The tasks behind ``task.defined`` events that name a source, read once per source."""

    def __init__(self) -> None:
        self._sources: dict[str, Mapping[str, Task]] = {}
        self._lock = threading.Lock()

    def task(self, event: TaskDefined) -> Task:
        """The task ``event`` names; raises TaskSourceError when its source no longer holds it."""
        if not event.source:
            raise TaskSourceError(f"task {event.task_id} names no source: its files are in its event")
        with self._lock:
            tasks = self._sources.get(event.source)
            if tasks is None:
                tasks = {t.id: t for t in open_source(event.source).tasks}
                self._sources[event.source] = tasks
        try:
            return tasks[event.task_id]
        except KeyError:
            raise TaskSourceError(f"{event.source}: no task {event.task_id!r} any more") from None

    def write_workspace(self, event: TaskDefined, dest: Path) -> None:
        """Write the task's starting workspace into ``dest`` from the source's files; raises
        TaskSourceError when they no longer hash to what the run recorded."""
        task = self.task(event)
        task.materialize(dest)
        found = task.workspace_hash if isinstance(task.workspace, GitCheckout) else tree_hash(dest)
        if event.content_hash and found != event.content_hash:
            raise TaskSourceError(
                f"{task.source}: task {task.id}: its files changed since the run recorded them "
                f"({found[:19]} now, {event.content_hash[:19]} recorded)"
            )


def event_task(event: TaskDefined) -> Task:
    """The task a built-in family's ``task.defined`` event carries (files, tests and test
    command in the event), for its tests to run in a sandbox (``run_tests``) as a sourced
    task's do. Raises TaskSourceError for an event that names a source instead."""
    if event.source:
        raise TaskSourceError(f"task {event.task_id} is read from {event.source}: its files are there")
    return Task(
        id=event.task_id,
        source="",
        kind="builtin",
        prompt=event.prompt,
        split=event.split,
        workspace=FileTree(dict(event.files)),
        tests=FileTree(dict(event.tests)),
        test_command=tuple(event.test_command),
        agent_timeout_s=event.budget_s,
        metadata={"family": event.family},
    )


@dataclass(frozen=True, slots=True)
class TestRun:
    """The task's tests on one workspace: the reward (None: none was read), how, and time."""

    reward: float | None
    detail: str
    seconds: float
    timed_out: bool
    exit_code: int


def run_tests(task: Task, sandbox: Sandbox, workspace: Path) -> TestRun:
    """Run ``task``'s tests on ``workspace`` (changed by them: pass a copy) in ``sandbox``: the
    workspace at the task's working directory, the tests read-only at ``/tests`` and the
    verifier's logs at ``/logs/verifier`` (where a sandbox cannot show a folder elsewhere, at
    their host paths), with the task's environment and verifier environment only, under the
    verifier's timeout. Raises SandboxError when the sandbox cannot run the task."""
    if (why := refusal(task, sandbox)) is not None:
        raise EvaluatorFailure(why)
    sandbox = sandbox_for_task(task, sandbox)
    with tempfile.TemporaryDirectory(prefix="gyre-tests-") as scratch_name:
        scratch = Path(scratch_name)
        scratch.chmod(0o755)  # the sandbox's user reaches its binds through here
        tests, logs = scratch / "tests", scratch / "logs"
        tests.mkdir()
        task.tests.materialize(tests)
        logs.mkdir()
        if sandbox.remaps:
            workdir, paths = task.workdir, {"tests": TESTS, "logs": LOGS}
            binds = [
                Bind(workspace, workdir, writable=True),
                Bind(tests, TESTS),
                Bind(logs, LOGS, writable=True),
            ]
        else:
            workdir, paths = str(workspace), {"tests": str(tests), "logs": str(logs)}
            binds = [Bind(p, str(p), writable=p != tests) for p in (workspace, tests, logs)]
        paths |= {"report": f"{paths['logs']}/report.xml", "python": sandbox.python}
        argv = list(task.test_command)
        for key, value in paths.items():
            argv = [part.replace("{" + key + "}", value) for part in argv]
        timeout = task.verifier_timeout_s
        ran = sandbox.run(
            argv,
            workdir=workdir,
            binds=binds,
            env=dict(task.env) | dict(task.verifier_env),
            timeout_s=timeout,
            limits=limits_for(task, timeout),
        )
        if ran.timed_out:
            return TestRun(None, f"the tests timed out after {timeout:g} s", ran.seconds, True, ran.exit_code)
        reward, detail = read_reward(
            logs,
            junit="{report}" in " ".join(task.test_command),
            exit_code=ran.exit_code,
            required=task.kind == "harbor",
        )
        if reward is None:
            tail = (ran.stderr.strip() or ran.stdout.strip()).splitlines()[-1:]
            detail = f"{detail} (exit {ran.exit_code}{': ' + tail[0][:200] if tail else ''})"
        return TestRun(reward, detail, ran.seconds, False, ran.exit_code)


class SandboxTestEvaluator:
    """Scores a preserved workspace by its task's tests in a sandbox (``run_tests`` on a copy,
    so the preserved state is never changed and a retry sees the same files). The reward is
    ``reward.txt``, or ``reward.json``'s ``reward`` (else the mean of its parts: partial
    credit), or the JUnit fraction passed. Tests that time out or leave no reward are an
    evaluator failure: the evaluation stays pending and is retried, then the execution is
    excluded, as for any evaluator."""

    def __init__(self, task: Task, sandbox: Sandbox) -> None:
        self._task = task
        self._sandbox = sandbox

    @property
    def name(self) -> str:
        return f"tests:{self._sandbox.kind}"

    def evaluate(self, state: PreservedState) -> EvaluationResult:
        preserved = Path(state.location)
        if not state.location or not preserved.is_dir():
            return EvaluationResult(
                None,
                EvaluationStatus.NOT_EVALUABLE,
                state.artifact_version,
                detail=f"no preserved workspace at {state.location!r}",
            )
        with tempfile.TemporaryDirectory(prefix="gyre-evaluate-") as scratch:
            copy = Path(scratch) / "workspace"
            Path(scratch).chmod(0o755)
            shutil.copytree(preserved, copy, symlinks=True)
            try:
                ran = run_tests(self._task, self._sandbox, copy)
            except GyreTrainError as exc:
                raise EvaluatorFailure(str(exc)) from exc
        if ran.reward is None:
            raise EvaluatorFailure(ran.detail)
        return EvaluationResult(
            ran.reward,
            EvaluationStatus.VALID,
            state.artifact_version,
            detail=f"{ran.detail} in {self._sandbox.kind}, {ran.seconds:.1f} s",
        )
