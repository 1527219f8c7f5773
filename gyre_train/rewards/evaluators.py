"""Two evaluators: a test command run in the preserved workspace, and a Python callable.

``CommandEvaluator`` runs the task's test command with the workspace as its working directory and
scores the fraction of tests passed, read from the JUnit XML report the command writes (pytest
``--junitxml``, and most other runners, produce one). Test files kept outside the workspace
(the agent never sees them) are written to a scratch folder the command names as ``{tests}``.
A missing workspace is "nothing evaluable";
a command that times out or leaves no report is an evaluator failure, retried by the runner.
The command gets a minimal environment, never the evaluator's: the evaluator holds the run's
database URL and keys, and the code under test is the policy's.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gyre_store import EvaluationStatus
from gyre_train.exceptions import EvaluatorFailure, InvalidConfigError
from gyre_train.rewards.evaluation import EvaluationResult, PreservedState

REPORT = "{report}"  # placeholder in the command for the JUnit XML report path
TESTS = "{tests}"  # placeholder for the folder holding the task's test files
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")  # from the evaluator's environment; nothing else is
DEFAULT_LANG = "C.UTF-8"  # where the evaluator has no LANG: tests read and write UTF-8 text


@dataclass(frozen=True, slots=True)
class JUnitCounts:
    """Totals of one JUnit XML report."""

    tests: int
    failures: int
    errors: int
    skipped: int
    failed_names: tuple[str, ...]

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped


def read_junit(path: Path) -> JUnitCounts:
    """Sum every test case of a JUnit XML report; raises EvaluatorFailure if it cannot be read."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as exc:
        raise EvaluatorFailure(f"cannot read test report {path}: {exc}") from exc
    tests = failures = errors = skipped = 0
    failed: list[str] = []
    for case in root.iter("testcase"):
        tests += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            failures += 1
            failed.append(name)
        elif case.find("error") is not None:
            errors += 1
            failed.append(name)
        elif case.find("skipped") is not None:
            skipped += 1
    return JUnitCounts(tests, failures, errors, skipped, tuple(failed))


def command_environment(scratch: Path, declared: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of a test command: ``PASSED_ENV`` from this process, ``HOME`` and
    ``TMPDIR`` in ``scratch`` (made here), then what the task ``declared``, which wins."""
    home, tmp = scratch / "home", scratch / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env = {"LANG": DEFAULT_LANG} | {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    return env | {"HOME": str(home), "TMPDIR": str(tmp)} | dict(declared)


class CommandEvaluator:
    """Runs ``command`` in the preserved workspace; the score is passed / (tests - skipped).

    The command sees only ``command_environment``: ``PATH``, ``LANG``, ``LC_ALL`` and ``TZ`` as
    the evaluator has them, ``HOME`` and ``TMPDIR`` in a scratch folder of its own, and ``env``,
    what the task declares it needs. ``env`` may not name a ``GYRE_`` variable.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        timeout_s: float = 600.0,
        env: Mapping[str, str] | None = None,
        name: str = "command",
        tests: Mapping[str, str] | None = None,
    ) -> None:
        if not command or not any(REPORT in part for part in command):
            raise InvalidConfigError(f"the test command must contain {REPORT} where the JUnit report goes")
        if timeout_s <= 0:
            raise InvalidConfigError(f"timeout_s must be positive, got {timeout_s}")
        self._command = tuple(command)
        self._timeout_s = timeout_s
        self._env = dict(env or {})
        if run_settings := sorted(k for k in self._env if k.upper().startswith("GYRE_")):
            raise InvalidConfigError(f"a test command may not be given gyre's own settings: {run_settings}")
        self._name = name
        self._tests = dict(tests or {})
        if any(Path(n).is_absolute() or ".." in Path(n).parts for n in self._tests):
            raise InvalidConfigError("test file names must be relative and stay inside the tests folder")

    @property
    def name(self) -> str:
        return self._name

    def evaluate(self, state: PreservedState) -> EvaluationResult:
        workspace = Path(state.location)
        if not state.location or not workspace.is_dir():
            return EvaluationResult(
                None,
                EvaluationStatus.NOT_EVALUABLE,
                state.artifact_version,
                detail=f"no preserved workspace at {state.location!r}",
            )
        with tempfile.TemporaryDirectory(prefix="gyre-eval-") as scratch:
            report = Path(scratch) / "report.xml"
            tests = Path(scratch) / "tests"
            for name, text in self._tests.items():
                (tests / name).parent.mkdir(parents=True, exist_ok=True)
                (tests / name).write_text(text)
            argv = [part.replace(REPORT, str(report)).replace(TESTS, str(tests)) for part in self._command]
            env = command_environment(Path(scratch), self._env)
            try:
                done = subprocess.run(
                    argv, cwd=workspace, env=env, capture_output=True, text=True, timeout=self._timeout_s
                )
            except subprocess.TimeoutExpired as exc:
                raise EvaluatorFailure(f"test command timed out after {self._timeout_s} s") from exc
            except OSError as exc:
                raise EvaluatorFailure(f"cannot run {argv[0]!r}: {exc}") from exc
            if not report.exists():
                tail = (done.stderr or done.stdout)[-500:]
                raise EvaluatorFailure(f"test command exited {done.returncode} without a report: {tail}")
            counts = read_junit(report)
        counted = counts.tests - counts.skipped
        if counted <= 0:
            raise EvaluatorFailure(f"the report lists no test that ran ({counts.tests} tests, all skipped)")
        return EvaluationResult(
            counts.passed / counted,
            EvaluationStatus.VALID,
            state.artifact_version,
            critique="\n".join(f"FAILED {n}" for n in counts.failed_names),
            detail=f"{counts.passed}/{counted} passed (exit {done.returncode})",
        )


class CallableEvaluator:
    """Wraps ``fn(state) -> float | EvaluationResult``; a float is a VALID score of that state."""

    def __init__(self, fn: Callable[[PreservedState], float | EvaluationResult], *, name: str = "callable"):
        self._fn = fn
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def evaluate(self, state: PreservedState) -> EvaluationResult:
        result = self._fn(state)
        if isinstance(result, EvaluationResult):
            return result
        if isinstance(result, int | float) and not isinstance(result, bool):
            return EvaluationResult(float(result), EvaluationStatus.VALID, state.artifact_version)
        return result  # type: ignore[return-value]  # malformed: the runner records it as such
