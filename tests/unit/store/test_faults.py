"""A fault point fires once: the first process to reach it exits as if killed; later ones pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gyre_store import FaultPoint

SCRIPT = """
import sys
from gyre_store import FaultPoint
fault = FaultPoint.from_env()
assert fault is not None
fault.reached("elsewhere")  # another point: nothing happens
fault.reached(sys.argv[1])
print("passed")
"""


def test_the_named_point_kills_the_first_process_only(tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    env = {
        "GYRE_FAULT": f"controller:x@{tmp_path / 'other'},cell-1:restore@{marker}",
        "PATH": "/usr/bin:/bin",
    }
    first = subprocess.run(
        [sys.executable, "-c", SCRIPT, "cell-1:restore"], env=env, capture_output=True, text=True
    )
    assert first.returncode == 137 and first.stdout == "" and marker.exists()
    again = subprocess.run(
        [sys.executable, "-c", SCRIPT, "cell-1:restore"], env=env, capture_output=True, text=True
    )
    assert again.returncode == 0 and again.stdout.strip() == "passed"
    assert not (tmp_path / "other").exists()


def test_no_variable_no_fault_and_a_bad_one_is_refused() -> None:
    assert FaultPoint.from_env({}) is None
    with pytest.raises(ValueError, match=r"<point>@<marker file>\[,...\]"):
        FaultPoint.from_env({"GYRE_FAULT": "cell-1:restore"})
