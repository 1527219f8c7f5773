"""The acceptance tests read `gyre sched replay`'s counts as numbers, not substrings."""

from __future__ import annotations

import subprocess

import pytest

from tests.acceptance.conftest import assert_replay_clean, replay_counts

CLEAN = "decisions  MATCH  12 inputs, 9 decisions recorded; 0 differ\ninvariants MATCH 0 violations\nlifecycle MATCH 0 disagreements"


def test_counts_are_read_as_whole_numbers() -> None:
    assert replay_counts(CLEAN) == {"differ": 0, "violations": 0, "disagreements": 0}
    # "10 differ" contains the substring "0 differ": it must read as ten.
    assert replay_counts(CLEAN.replace("0 differ", "10 differ"))["differ"] == 10


def _replay(stdout: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["gyre", "sched", "replay"], rc, stdout, "")


def test_a_clean_report_passes() -> None:
    assert_replay_clean(_replay(CLEAN))


@pytest.mark.parametrize(
    "stdout, rc",
    [
        (CLEAN.replace("0 differ", "10 differ"), 0),
        (CLEAN.replace("0 violations", "20 violations"), 0),
        (CLEAN.replace("0 disagreements", ""), 0),  # a count missing from the report
        (CLEAN, 1),
    ],
)
def test_a_report_with_anything_but_zero_fails(stdout: str, rc: int) -> None:
    with pytest.raises(AssertionError):
        assert_replay_clean(_replay(stdout, rc))
