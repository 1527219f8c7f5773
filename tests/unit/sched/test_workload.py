"""Workload models: the fitted profiles and user files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gyre_sched import Outcome, WorkloadFileError, load_workload, parse_workload, workload_stats
from gyre_sched.sim import WORKLOADS


def test_122b_profile_is_near_the_paper() -> None:
    stats = workload_stats(WORKLOADS["nl2repo-122b"], np.random.default_rng(0), 4000, 16)
    # residuals of the fit are documented in docs/scheduler.md; these bounds catch a broken model
    assert stats.mean_execution_h == pytest.approx(1.93, rel=0.2)
    assert stats.mean_query_h == pytest.approx(2.96, rel=0.2)
    assert stats.queries_over_4h == pytest.approx(0.0951, abs=0.015)
    assert stats.harness_timeout_rate == pytest.approx(0.0625, abs=0.01)
    assert stats.overall_timeout_rate == pytest.approx(0.0087, abs=0.003)


def test_2_4t_profile_is_near_the_paper() -> None:
    stats = workload_stats(WORKLOADS["nl2repo-2.4t"], np.random.default_rng(0), 4000, 16)
    assert stats.queries_over_4h == pytest.approx(0.611, abs=0.03)
    assert stats.overall_share_at_ceiling == pytest.approx(0.382, abs=0.03)


def test_csv_file_by_query(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("query,duration_h,outcome\nq1,1.0,completed\nq1,2.0,harness_timeout\nq2,3.0,\n")
    model = load_workload(path)
    assert model.by_query and len(model.groups) == 2
    group = model.sample_group(np.random.default_rng(1), 5)
    assert len(group.durations_s) == 5
    assert set(group.durations_s) <= {3600.0, 7200.0, 10800.0}
    assert set(group.outcomes) <= {Outcome.COMPLETED, Outcome.HARNESS_TIMEOUT}


def test_json_forms() -> None:
    assert parse_workload("[10, 20.5]", "json", "x").groups[0].durations_s == (10.0, 20.5)
    model = parse_workload('{"executions": [{"duration_s": 5, "query": "a"}]}', "json", "x")
    assert model.by_query


@pytest.mark.parametrize(
    ("text", "fmt", "words"),
    [
        ("duration_s\n10\n-3\n", "csv", "row 2"),
        ("duration_s\n10\nabc\n", "csv", "not a number"),
        ("query,other\nq,1\n", "csv", "no duration"),
        ("duration_s,outcome\n1,exploded\n", "csv", "outcome"),
        ("", "csv", "empty"),
        ("[1, true]", "json", "row 2"),
        ("[1, null]", "json", "row 2"),
        ("{oops", "json", "not valid JSON"),
        ('{"runs": []}', "json", "expected a list"),
        ("[]", "json", "no executions"),
        ("[1]", "yaml", "unknown format"),
        ("[1e999]", "json", "finite"),
    ],
)
def test_bad_rows_are_refused(text: str, fmt: str, words: str) -> None:
    with pytest.raises(WorkloadFileError, match=words):
        parse_workload(text, fmt, "f")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadFileError, match="cannot read"):
        load_workload(tmp_path / "absent.csv")
