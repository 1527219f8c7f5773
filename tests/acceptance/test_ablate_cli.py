"""``gyre ablate`` on executions recorded by ``gyre tracegen``, the way a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.conftest import gyre


def test_tracegen_then_ablate_prints_the_fractions_beside_the_paper(
    fresh_database_url: str, tmp_path: Path
) -> None:
    env = {"GYRE_DATABASE_URL": fresh_database_url}
    out = gyre("tracegen", "--executions", "2", "--requests", "24", "--subagents", "1", "--compact-at", "6000",
               "--run-id", "abl", env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr

    report, png = tmp_path / "ablation.json", tmp_path / "ablation.png"
    ablate = gyre("ablate", "--jmax", "1,5,all", "--json", str(report), "--plot", str(png), env=env)
    assert ablate.returncode == 0, ablate.stderr
    assert "paper: 41.4%" in ablate.stdout and "paper: 74.8%" in ablate.stdout
    data = json.loads(report.read_text())
    summaries = {s["setting"]: s for s in data["summaries"]}
    assert set(summaries) == {"class J_max=1", "class J_max=5", "class J_max=all"}
    assert summaries["class J_max=all"]["fb_token_fraction"] == 1.0
    assert (
        0 < summaries["class J_max=1"]["fb_token_fraction"] < summaries["class J_max=5"]["fb_token_fraction"]
    )
    assert all(s["executions"] == 2 for s in summaries.values())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    by_sql = gyre("ablate", "--jmax", "2", "--priority", "flat,main>sub_agent", "--executions",
                  "SELECT execution_id FROM gyre_tree_state WHERE execution_id = 'abl-e1'", "--json",
                  str(report), env=env)  # fmt: skip
    assert by_sql.returncode == 0, by_sql.stderr
    data = json.loads(report.read_text())
    assert {e["execution_id"] for e in data["executions"]} == {"abl-e1"}
    assert {s["setting"] for s in data["summaries"]} == {
        "flat J_max=2",
        "flat J_max=all",
        "main>sub_agent J_max=2",
        "main>sub_agent J_max=all",
    }

    bad = gyre("ablate", "--jmax", "0", env=env)
    assert bad.returncode == 2 and "--jmax" in bad.stderr
    none = gyre("ablate", "--executions", "nope", env=env)
    assert none.returncode == 2 and "no trajectory tree" in none.stderr
