"""The command evaluator (a real pytest run in a workspace) and the Python-callable evaluator."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gyre_store import EvaluationStatus, FinishReason, InMemoryEventLog
from gyre_train import (
    CallableEvaluator,
    CommandEvaluator,
    EvaluationConfig,
    EvaluationResult,
    EvaluationRunner,
    EvaluatorFailure,
    InvalidConfigError,
    PreservedState,
    RewardStatus,
    read_junit,
)
from tests.unit.train.runs import dispatch_group, finish, start

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml={report}"]


def _state(location: Path | str) -> PreservedState:
    return PreservedState("e0", "run", "v1", ("refs/heads/main",), str(location))


def test_command_evaluator_scores_the_fraction_of_tests_passed(tmp_path: Path) -> None:
    (tmp_path / "test_repo.py").write_text(
        "import pytest\n"
        "def test_a(): assert True\n"
        "def test_b(): assert True\n"
        "def test_c(): assert True\n"
        "def test_d(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='not counted')\n"
        "def test_e(): pass\n"
    )
    result = CommandEvaluator(PYTEST, timeout_s=120).evaluate(_state(tmp_path))
    assert result.status is EvaluationStatus.VALID and result.score == 0.75
    assert result.artifact_version == "v1" and "test_d" in result.critique and "test_a" not in result.critique


def test_command_evaluator_failures(tmp_path: Path) -> None:
    missing = CommandEvaluator(PYTEST).evaluate(_state(tmp_path / "gone"))
    assert missing.status is EvaluationStatus.NOT_EVALUABLE and missing.score is None
    silent = CommandEvaluator([sys.executable, "-c", "import sys; sys.exit(3)", "{report}"])
    with pytest.raises(EvaluatorFailure, match="exited 3 without a report"):
        silent.evaluate(_state(tmp_path))
    slow = CommandEvaluator([sys.executable, "-c", "import time; time.sleep(5)", "{report}"], timeout_s=0.2)
    with pytest.raises(EvaluatorFailure, match="timed out"):
        slow.evaluate(_state(tmp_path))
    garbage = CommandEvaluator(
        [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('<oops')", "{report}"]
    )
    with pytest.raises(EvaluatorFailure, match="cannot read test report"):
        garbage.evaluate(_state(tmp_path))
    with pytest.raises(InvalidConfigError, match="report"):
        CommandEvaluator(["pytest"])


def test_read_junit_counts_failures_errors_and_skips(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        "<testsuites><testsuite>"
        "<testcase classname='a' name='ok'/>"
        "<testcase classname='a' name='bad'><failure/></testcase>"
        "<testcase classname='a' name='boom'><error/></testcase>"
        "<testcase classname='a' name='later'><skipped/></testcase>"
        "</testsuite><testsuite><testcase classname='b' name='ok'/></testsuite></testsuites>"
    )
    counts = read_junit(report)
    assert (counts.tests, counts.failures, counts.errors, counts.skipped, counts.passed) == (5, 1, 1, 1, 2)
    assert counts.failed_names == ("a::bad", "a::boom")


def test_the_command_evaluator_behind_the_runner_after_a_timeout(tmp_path: Path) -> None:
    log = InMemoryEventLog()
    dispatch_group(log, "run", "g0", ["e0"])
    start(log, "e0", "run")
    finish(log, "e0", "run", FinishReason.HARNESS_TIMEOUT)
    (tmp_path / "test_half.py").write_text("def test_a(): pass\ndef test_b(): assert False\n")
    runner = EvaluationRunner(log, CommandEvaluator(PYTEST, timeout_s=120), EvaluationConfig())
    runner.preserve("e0", "commit-1", branch_refs=["refs/heads/main"], location=str(tmp_path))
    outcome = runner.settle("e0", deadline=float("inf"))
    assert (outcome.status, outcome.reward) == (RewardStatus.VALID, 0.5)


def test_callable_evaluator_wraps_floats_and_passes_results_through() -> None:
    assert CallableEvaluator(lambda s: 1).evaluate(_state("x")) == EvaluationResult(
        1.0, EvaluationStatus.VALID, "v1"
    )
    given = EvaluationResult(None, EvaluationStatus.NOT_EVALUABLE, "v1", detail="empty")
    assert CallableEvaluator(lambda s: given, name="judge").evaluate(_state("x")) is given
    assert CallableEvaluator(lambda s: 0.0, name="judge").name == "judge"
