"""Rebuild the paper's scheduling ablation and speedup tables by simulation.

Each row is the mean over the given seeds of a preset run with the shared calibration;
the paper's figure stands beside it with the relative residual (what it is measured
against is ``ABLATION_NOTE`` / ``SPEEDUP_NOTE``, printed under each table), its role
(``split``), and a figure is met when that residual is within ``MET_TOLERANCE``.
Nothing is tuned here (``fit`` does that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec
import numpy as np

from gyre_sched.sim.paper import PAPER_ABLATION, PAPER_SPEEDUP
from gyre_sched.sim.presets import ABLATION, SPEEDUP, WORKLOADS, Preset
from gyre_sched.sim.simulator import simulate
from gyre_sched.sim.split import ROLE_NOTE, Role, ablation_role, speedup_role
from gyre_sched.sim.workload import WorkloadModel

Progress = Callable[[str], None]

# A figure is met when its residual is within this fraction of the paper's value; fixed
# before the refit's held-out residuals were looked at (docs/scheduler.md).
MET_TOLERANCE = 0.05

# What each table's residual is measured against, printed beside the table (and copied
# with it into README.md; tests/unit/sched/test_paper_tables.py holds the copy to this).
ABLATION_NOTE = (
    f"Residual: (sim vs E0) / (paper vs E0) - 1, against the paper's one figure for the row; "
    f"MET when |residual| <= {MET_TOLERANCE:.0%}. {ROLE_NOTE}"
)
SPEEDUP_NOTE = (
    f"Residual: sim / (the nearer end of the paper's range) - 1, and 0 inside the range (a "
    f"single paper figure is a range of one); MET when |residual| <= {MET_TOLERANCE:.0%}. {ROLE_NOTE}"
)


def residual(simulated: float, paper: tuple[float, float]) -> float:
    """simulated / paper - 1 against the nearer end of the paper's range; 0 inside it."""
    lo, hi = paper
    if simulated < lo:
        return simulated / lo - 1
    if simulated > hi:
        return simulated / hi - 1
    return 0.0


def met(value: float) -> bool:
    """Whether a residual is within ``MET_TOLERANCE``."""
    return abs(value) <= MET_TOLERANCE


class AblationRow(msgspec.Struct, frozen=True):
    """Simulated against reported, for one ablation row."""

    row: str
    description: str
    policy: str
    phi: float
    mu: int
    paper_total_h: float
    sim_total_h: float
    paper_vs_e0: float
    sim_vs_e0: float
    residual: float  # sim_vs_e0 / paper_vs_e0 - 1
    met: bool
    role: Role


class SpeedupRow(msgspec.Struct, frozen=True):
    """Simulated cumulative speedups of the elastic policy for one setting."""

    setting: str
    steps: int
    elastic_h: float
    async_h: float
    colocate_h: float
    sim_vs_async: float
    sim_vs_colocate: float
    paper_vs_async: tuple[float, float]
    paper_vs_colocate: tuple[float, float]
    paper_totals_h: tuple[float, float, float] | None
    residual_vs_async: float  # against the nearer end of the paper's range
    residual_vs_colocate: float
    met_vs_async: bool
    met_vs_colocate: bool
    role_vs_async: Role
    role_vs_colocate: Role


def mean_total(
    preset: Preset,
    seeds: Sequence[int],
    progress: Progress | None = None,
    workload: WorkloadModel | None = None,
) -> float:
    """Mean simulated total hours of ``preset`` over ``seeds`` (its named workload by default)."""
    model = workload if workload is not None else WORKLOADS[preset.workload]
    totals = []
    for seed in seeds:
        run = simulate(preset.sched, preset.cluster, model, steps=preset.steps, seed=seed)
        totals.append(run.result.total_h)
        if progress is not None:
            progress(f"{preset.name} seed {seed}")
    return float(np.mean(totals))


def ablation_table(
    seeds: Sequence[int],
    progress: Progress | None = None,
    *,
    presets: Mapping[str, Preset] = ABLATION,
    workloads: Mapping[str, WorkloadModel] = WORKLOADS,
) -> list[AblationRow]:
    """Every row of the scheduling ablation, simulated."""
    totals = {
        row: mean_total(preset, seeds, progress, workloads[preset.workload])
        for row, preset in presets.items()
    }
    rows = []
    for row, preset in presets.items():
        paper = PAPER_ABLATION[row]
        sim_vs_e0 = totals[row] / totals["E0"]
        off = residual(sim_vs_e0, (paper.vs_e0, paper.vs_e0))
        rows.append(
            AblationRow(
                row=row,
                description=preset.description,
                policy=preset.sched.policy.value,
                phi=preset.sched.phi,
                mu=preset.sched.mu,
                paper_total_h=paper.total_h,
                sim_total_h=totals[row],
                paper_vs_e0=paper.vs_e0,
                sim_vs_e0=sim_vs_e0,
                residual=off,
                met=met(off),
                role=ablation_role(row),
            )
        )
    return rows


def speedup_table(
    seeds: Sequence[int],
    progress: Progress | None = None,
    *,
    presets: Mapping[str, Preset] = SPEEDUP,
    workloads: Mapping[str, WorkloadModel] = WORKLOADS,
) -> list[SpeedupRow]:
    """Cumulative speedups of the elastic policy over Async and Colocate, simulated."""
    rows = []
    for setting, paper in PAPER_SPEEDUP.items():
        elastic, async_, colocate = (
            mean_total(
                presets[f"{setting}-{policy}"],
                seeds,
                progress,
                workloads[presets[f"{setting}-{policy}"].workload],
            )
            for policy in ("elastic", "async", "colocate")
        )
        vs_async, vs_colocate = async_ / elastic, colocate / elastic
        off_async = residual(vs_async, paper.vs_async)
        off_colocate = residual(vs_colocate, paper.vs_colocate)
        rows.append(
            SpeedupRow(
                setting=setting,
                steps=presets[f"{setting}-elastic"].steps,
                elastic_h=elastic,
                async_h=async_,
                colocate_h=colocate,
                sim_vs_async=vs_async,
                sim_vs_colocate=vs_colocate,
                paper_vs_async=paper.vs_async,
                paper_vs_colocate=paper.vs_colocate,
                paper_totals_h=paper.totals_h,
                residual_vs_async=off_async,
                residual_vs_colocate=off_colocate,
                met_vs_async=met(off_async),
                met_vs_colocate=met(off_colocate),
                role_vs_async=speedup_role(setting, "async"),
                role_vs_colocate=speedup_role(setting, "colocate"),
            )
        )
    return rows
