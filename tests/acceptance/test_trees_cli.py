"""``gyre tracegen`` and ``gyre trees``, the way a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.conftest import gyre


def test_tracegen_then_stats_and_show(fresh_database_url: str, tmp_path: Path) -> None:
    env = {"GYRE_DATABASE_URL": fresh_database_url}
    out = gyre(
        "tracegen", "--requests", "30", "--subagents", "1", "--compact-at", "6000", "--run-id", "acc", env=env
    )
    assert out.returncode == 0, out.stderr
    assert "candidate trajectories" in out.stdout

    stats = gyre("trees", "stats", "--all", "--json", env=env)
    assert stats.returncode == 0, stats.stderr
    [s] = json.loads(stats.stdout)
    assert s["execution_id"] == "acc-e0" and s["requests"] >= 30 and s["candidates"] >= 3
    assert s["node_occurrences_expanded"] - s["unique_message_nodes"] == s["repetitions_saved"]

    png = tmp_path / "tree.png"
    show = gyre("trees", "show", "--execution", "acc-e0", "--out", str(png), env=env)
    assert show.returncode == 0, show.stderr
    assert "main leaf" in show.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    missing = gyre("trees", "stats", "--execution", "nope", env=env)
    assert missing.returncode != 0 and "no trajectory tree" in missing.stderr
