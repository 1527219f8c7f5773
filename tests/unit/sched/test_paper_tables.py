"""The README's simulated tables are what the simulator prints, and no residual drifts.

Both tables are recomputed at the README's setting (the presets, seeds 0, 1, 2; the
simulator is deterministic per seed), then every printed figure and role must match, every
met figure stay within ``MET_TOLERANCE`` of the paper, and every missed one within its
printed residual plus one percentage point; under each table the README must say what its
residual is measured against, as the simulator prints it. Changing the simulator therefore
means reprinting the README (``gyre simulate --preset ablation-table`` / ``speedup-table``),
misses included.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gyre_sched.sim import (
    ABLATION_NOTE,
    MET_TOLERANCE,
    PAPER_SPEEDUP_NOT_SIMULATED,
    SPEEDUP_NOTE,
    AblationRow,
    SpeedupRow,
    ablation_table,
    speedup_table,
)

README = Path(__file__).resolve().parents[3] / "README.md"
SEEDS = (0, 1, 2)  # what the README says it prints
FIGURE = 0.0015  # a printed 3-decimal figure, with room for the last bit of a sum
PERCENT = 0.0006  # a printed residual, one decimal of a percent
MISS_TOLERANCE = 0.01  # a missed figure may not get worse than printed by more than 1 point


def _table(header: str) -> tuple[list[list[str]], str]:
    """The body rows of the README table whose header row starts with ``header``, and the
    paragraph right under it (whitespace folded)."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 2
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start:end]]
    under = "\n".join(lines[end:]).strip().split("\n\n", 1)[0]
    return rows, " ".join(under.split())


def _percent(text: str) -> float:
    return float(text.rstrip("%")) / 100


def _bound(verdict: str, printed: float) -> float:
    return MET_TOLERANCE if verdict == "MET" else abs(printed) + MISS_TOLERANCE


@pytest.fixture(scope="module")
def ablation() -> dict[str, AblationRow]:
    return {r.row: r for r in ablation_table(SEEDS)}


@pytest.fixture(scope="module")
def speedups() -> dict[str, SpeedupRow]:
    return {r.setting: r for r in speedup_table(SEEDS)}


def test_every_ablation_row_is_printed_as_simulated_and_within_its_bound(
    ablation: dict[str, AblationRow],
) -> None:
    printed, note = _table("| row | setting | (phi,mu) |")
    assert note == ABLATION_NOTE  # what the residual is measured against, and what the roles mean
    assert [cells[0] for cells in printed] == list(ablation)
    for row, _, _, paper_h, sim_h, paper_vs, sim_vs, off, role, verdict in printed:
        r = ablation[row]
        assert float(paper_h) == r.paper_total_h and float(paper_vs) == r.paper_vs_e0, row
        assert float(sim_h) == pytest.approx(r.sim_total_h, abs=0.015), row
        assert float(sim_vs) == pytest.approx(r.sim_vs_e0, abs=FIGURE), row
        assert role == r.role.value, row
        if row == "E0":
            assert verdict == "" and r.residual == 0.0
            continue
        assert _percent(off) == pytest.approx(r.residual, abs=PERCENT), row
        assert verdict == ("MET" if abs(_percent(off)) <= MET_TOLERANCE else "MISSED"), row
        assert abs(r.residual) <= _bound(verdict, _percent(off)), f"{row}: residual {r.residual:+.1%}"


def test_every_speedup_is_printed_as_simulated_and_within_its_bound(speedups: dict[str, SpeedupRow]) -> None:
    printed, note = _table("| setting | vs | sim h (E / baseline) |")
    assert note == SPEEDUP_NOTE
    simulated = [cells for cells in printed if cells[-1] != "not simulated"]
    assert len(simulated) == 2 * len(speedups)
    for setting_steps, vs, hours, _, sim, off, role, verdict in simulated:
        setting = re.sub(r" \(\d+ steps\)$", "", setting_steps)
        r = speedups[setting]
        value, residual, baseline_h, expected_role = (
            (r.sim_vs_async, r.residual_vs_async, r.async_h, r.role_vs_async)
            if vs == "Async"
            else (r.sim_vs_colocate, r.residual_vs_colocate, r.colocate_h, r.role_vs_colocate)
        )
        elastic_h, other_h = (float(x) for x in hours.split(" / "))
        assert elastic_h == pytest.approx(r.elastic_h, abs=0.051) and other_h == pytest.approx(
            baseline_h, abs=0.051
        )
        assert float(sim) == pytest.approx(value, abs=FIGURE), f"{setting} vs {vs}"
        assert role == expected_role.value, f"{setting} vs {vs}"
        assert _percent(off) == pytest.approx(residual, abs=PERCENT), f"{setting} vs {vs}"
        assert verdict == ("MET" if abs(_percent(off)) <= MET_TOLERANCE else "MISSED"), f"{setting} vs {vs}"
        assert abs(residual) <= _bound(verdict, _percent(off)), f"{setting} vs {vs}: {residual:+.1%}"
    # the paper's rows with no execution profile are shown, and say they are not simulated
    assert len(printed) - len(simulated) == 2 * len(PAPER_SPEEDUP_NOT_SIMULATED)
