"""``gyre simulate`` run the way a user runs it: a subprocess, a JSON file, an exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gyre(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gyre_tools.cli", "simulate", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "MPLBACKEND": "Agg", **(env or {})},
        check=False,
    )


@pytest.mark.acceptance
def test_smoke_preset_writes_json_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    done = _gyre("--preset", "smoke", "--out", str(out), env={"GYRE_SIM_SEED": "3"})
    assert done.returncode == 0, done.stderr
    document = json.loads((out / "smoke.json").read_text())
    result = document["result"]
    assert result["seed"] == 3
    assert len(result["step_durations_h"]) == 4
    assert result["total_h"] == pytest.approx(sum(result["step_durations_h"]))
    assert result["mean_staleness"] >= 0
    first = result["transitions"][0]
    assert first["cell"] == 0 and first["direction"] == "rollout_to_train"
    assert first["w"] <= first["c_r"] - first["c_e"]
    assert {b["policy"] for b in document["baselines"]} == {"async", "colocate"}
    assert {p.name for p in out.glob("*.png")} == {
        "smoke-roles.png",
        "smoke-steps.png",
        "smoke-waterlevel.png",
    }


@pytest.mark.acceptance
def test_infeasible_setting_exits_2_with_the_constraint(tmp_path: Path) -> None:
    done = _gyre("--preset", "smoke", "--rho-min", "0", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "rho_min=0.0 must lie in (0, 1]" in done.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("duration_s\n12\n-1\n")
    done = _gyre("--preset", "smoke", "--workload", str(bad), "--out", str(tmp_path))
    assert done.returncode == 2
    assert "bad.csv row 2" in done.stderr


@pytest.mark.acceptance
def test_ablation_table_prints_roles_and_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    done = _gyre("--preset", "ablation-table", "--seeds", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "changed after seen" in done.stdout and "denominator" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["row"] for r in rows][:2] == ["A0", "A1"]
    assert all(r["met"] == (abs(r["residual"]) <= 0.05) for r in rows)
