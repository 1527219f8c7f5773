"""Harbor's contract for a task, checked in a sandbox: the tests must not pass on the untouched
workspace, and must pass after the task's solution ran in it.

Each check runs in a fresh sandbox on a freshly written workspace, seen at the task's WORKDIR,
with ``/tests`` (and ``/solution`` for the solution) read-only and ``/logs/verifier`` writable.
The reward is ``/logs/verifier/reward.txt`` (one number) or ``reward.json`` (named numbers: its
``"reward"`` entry, else their mean); a command naming ``{report}`` is scored by the fraction of
its JUnit report's tests that passed; a JSONL task without either is scored by its exit status
(0: 1.0, else 0.0). A Harbor task that writes no reward file has no reward: the check fails.
Under a container kind (podman, docker) both run in the task's image: its Dockerfile built, RUN
lines and all (``sandbox_for_task``).
"""

from __future__ import annotations

import enum
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gyre_train.exceptions import EvaluatorFailure, GyreTrainError, SandboxError
from gyre_train.rewards.evaluators import read_junit
from gyre_train.sandbox import Bind, Limits, RunResult, Sandbox
from gyre_train.sandbox.images import ContainerSandbox
from gyre_train.tasks.task import Task

TESTS, SOLUTION, LOGS = "/tests", "/solution", "/logs/verifier"
DEFAULT_MEMORY_MB = 4096
DEFAULT_PROCESSES = 256
DEFAULT_FILE_SIZE_MB = 1024


class Verdict(enum.StrEnum):
    """How a task's check ended."""

    OK = "ok"
    NO_SOLUTION = "no solution"  # the untouched check passed; there is nothing to solve with
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One task's check: the reward of each phase (None: none was read), time, verdict, why."""

    task_id: str
    untouched: float | None
    solved: float | None
    seconds: float
    verdict: Verdict
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict is Verdict.FAIL


def limits_for(task: Task, timeout_s: float) -> Limits:
    """The task's resources as limits: memory (default 4 GiB of address space), CPU seconds for
    the timeout on its CPUs, 256 processes, files up to its storage (default 1 GiB)."""
    cpus = task.resources.cpus or 1.0
    return Limits(
        memory_mb=task.resources.memory_mb or DEFAULT_MEMORY_MB,
        cpu_s=math.ceil(timeout_s * cpus) + 1,
        processes=DEFAULT_PROCESSES,
        file_size_mb=task.resources.storage_mb or DEFAULT_FILE_SIZE_MB,
    )


def refusal(task: Task, sandbox: Sandbox) -> str | None:
    """Why ``sandbox`` cannot run ``task`` as its source describes it, or None."""
    if task.fixed_paths and not sandbox.remaps:
        return (
            f"{task.source}: task {task.id} uses absolute paths ({TESTS}, {LOGS}, {task.workdir}) that the "
            f"{sandbox.kind} sandbox cannot provide; use --sandbox bwrap"
        )
    if sandbox.kind == "bwrap" and task.unsupported:
        line, keyword = task.unsupported[0]
        return (
            f"{task.dockerfile}:{line}: {keyword} cannot be applied under bwrap (the host's root is the "
            "base; only FROM, WORKDIR, COPY, ADD and ENV are); use --sandbox podman or docker, which build "
            "the Dockerfile"
        )
    return None


def sandbox_for_task(task: Task, sandbox: Sandbox) -> Sandbox:
    """``sandbox`` ready for ``task``: a container sandbox running the task's image (its
    Dockerfile built, see ``gyre_train.sandbox.images``), any other kind as it is. Raises
    SandboxError when the image cannot be had."""
    if isinstance(sandbox, ContainerSandbox):
        return sandbox.with_image(sandbox.image_for(task.dockerfile, task.image))
    return sandbox


def check_task(task: Task, sandbox: Sandbox) -> CheckResult:
    """Run both checks of ``task``; raises SandboxError when ``sandbox`` cannot run it."""
    if (why := refusal(task, sandbox)) is not None:
        raise SandboxError(why)
    sandbox = sandbox_for_task(task, sandbox)
    untouched, detail, seconds = _phase(task, sandbox, solve=False)
    if untouched is None:
        return CheckResult(task.id, None, None, seconds, Verdict.FAIL, f"untouched: {detail}")
    if untouched >= 1.0:
        return CheckResult(
            task.id, untouched, None, seconds, Verdict.FAIL, "the tests pass on the untouched workspace"
        )
    if task.solution is None:
        return CheckResult(task.id, untouched, None, seconds, Verdict.NO_SOLUTION, "no solution to check")
    solved, detail, more = _phase(task, sandbox, solve=True)
    seconds += more
    if solved is None:
        return CheckResult(task.id, untouched, None, seconds, Verdict.FAIL, f"solved: {detail}")
    if solved < 1.0:
        return CheckResult(
            task.id, untouched, solved, seconds, Verdict.FAIL, f"the tests fail after the solution: {detail}"
        )
    return CheckResult(task.id, untouched, solved, seconds, Verdict.OK)


def check_or_error(task: Task, sandbox: Sandbox) -> CheckResult:
    """``check_task``, with a task that cannot be checked reported as a failed check."""
    try:
        return check_task(task, sandbox)
    except GyreTrainError as exc:
        return CheckResult(task.id, None, None, 0.0, Verdict.FAIL, str(exc))


def _phase(task: Task, sandbox: Sandbox, *, solve: bool) -> tuple[float | None, str, float]:
    """One fresh sandbox: (the solution, then) the tests; (reward, detail, seconds)."""
    with tempfile.TemporaryDirectory(prefix="gyre-check-") as scratch_name:
        scratch = Path(scratch_name)
        scratch.chmod(0o755)  # the sandbox's user reaches its binds through here
        workspace, tests, solution, logs = (scratch / n for n in ("workspace", "tests", "solution", "logs"))
        task.materialize(workspace)
        tests.mkdir()
        task.tests.materialize(tests)
        logs.mkdir()
        if solve and task.solution is not None:
            solution.mkdir()
            task.solution.materialize(solution)
        if sandbox.remaps:
            workdir, paths = task.workdir, {"tests": TESTS, "solution": SOLUTION, "logs": LOGS}
            binds = [
                Bind(workspace, workdir, writable=True),
                Bind(tests, TESTS),
                Bind(logs, LOGS, writable=True),
            ]
            if solve:
                binds.append(Bind(solution, SOLUTION))
        else:
            workdir, paths = (
                str(workspace),
                {"tests": str(tests), "solution": str(solution), "logs": str(logs)},
            )
            binds = [Bind(p, str(p), writable=p in (workspace, logs)) for p in (workspace, tests, logs)]
        paths |= {"report": f"{paths['logs']}/report.xml", "python": sandbox.python}
        seconds = 0.0
        notes: list[str] = []
        if solve:
            ran = _run(
                task, sandbox, task.solve_command, paths, workdir, binds, task.agent_timeout_s, dict(task.env)
            )
            seconds += ran.seconds
            if ran.exit_code != 0:
                notes.append(
                    f"solve exited {ran.exit_code}{' (timed out)' if ran.timed_out else ''}: {_tail(ran)}"
                )
        env = dict(task.env) | dict(task.verifier_env)
        ran = _run(task, sandbox, task.test_command, paths, workdir, binds, task.verifier_timeout_s, env)
        seconds += ran.seconds
        if ran.timed_out:
            return None, f"the tests timed out after {task.verifier_timeout_s:g} s", seconds
        reward, detail = read_reward(
            logs,
            junit="{report}" in " ".join(task.test_command),
            exit_code=ran.exit_code,
            required=task.kind == "harbor",
        )
        if reward is None or reward < 1.0:
            notes.append(detail or f"tests exited {ran.exit_code}: {_tail(ran)}")
        return reward, "; ".join(n for n in notes if n), seconds


def _run(
    task: Task,
    sandbox: Sandbox,
    command: tuple[str, ...],
    paths: dict[str, str],
    workdir: str,
    binds: list[Bind],
    timeout_s: float,
    env: dict[str, str],
) -> RunResult:
    argv = list(command)
    for key, value in paths.items():  # only these placeholders: a command may hold other braces
        argv = [part.replace("{" + key + "}", value) for part in argv]
    return sandbox.run(
        argv, workdir=workdir, binds=binds, env=env, timeout_s=timeout_s, limits=limits_for(task, timeout_s)
    )


def read_reward(logs: Path, *, junit: bool, exit_code: int, required: bool) -> tuple[float | None, str]:
    """The reward the tests left in ``logs`` (see the module docstring) and a note on how."""
    text_file, json_file = logs / "reward.txt", logs / "reward.json"
    if text_file.is_file():
        raw = text_file.read_text().strip()
        try:
            return float(raw), f"reward.txt {raw}"
        except ValueError:
            return None, f"reward.txt holds {raw[:40]!r}, not a number"
    if json_file.is_file():
        try:
            parts = json.loads(json_file.read_text())
        except json.JSONDecodeError as exc:
            return None, f"reward.json is not JSON: {exc.msg}"
        if (
            not isinstance(parts, dict)
            or not parts
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in parts.values())
        ):
            return None, "reward.json must map names to numbers"
        value = float(parts["reward"]) if "reward" in parts else sum(parts.values()) / len(parts)
        return value, f"reward.json {parts}"
    if junit and (logs / "report.xml").is_file():
        try:
            counts = read_junit(logs / "report.xml")
        except EvaluatorFailure as exc:
            return None, str(exc)
        counted = counts.tests - counts.skipped
        if counted <= 0:
            return None, "the JUnit report lists no test that ran"
        return counts.passed / counted, f"{counts.passed}/{counted} tests passed"
    if required:
        return None, f"the tests wrote no reward.txt or reward.json in {LOGS}"
    return (1.0 if exit_code == 0 else 0.0), f"tests exited {exit_code}"


def _tail(ran: RunResult) -> str:
    text = (ran.stderr.strip() or ran.stdout.strip()).splitlines()
    return text[-1][:200] if text else ""
