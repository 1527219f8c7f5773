"""Rebuild the paper's scheduling ablation and speedup tables by simulation.

Each row is the mean over the given seeds of a preset run with the shared calibration;
the paper's figure stands beside it with the relative residual. Nothing is tuned here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
import numpy as np

from gyre_sched.sim.paper import PAPER_ABLATION, PAPER_SPEEDUP
from gyre_sched.sim.presets import ABLATION, SPEEDUP, WORKLOADS, Preset
from gyre_sched.sim.simulator import simulate

Progress = Callable[[str], None]


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


def mean_total(preset: Preset, seeds: Sequence[int], progress: Progress | None = None) -> float:
    """Mean simulated total hours of ``preset`` over ``seeds``."""
    totals = []
    for seed in seeds:
        run = simulate(
            preset.sched, preset.cluster, WORKLOADS[preset.workload], steps=preset.steps, seed=seed
        )
        totals.append(run.result.total_h)
        if progress is not None:
            progress(f"{preset.name} seed {seed}")
    return float(np.mean(totals))


def ablation_table(seeds: Sequence[int], progress: Progress | None = None) -> list[AblationRow]:
    """Every row of the scheduling ablation, simulated."""
    totals = {row: mean_total(preset, seeds, progress) for row, preset in ABLATION.items()}
    rows = []
    for row, preset in ABLATION.items():
        paper = PAPER_ABLATION[row]
        sim_vs_e0 = totals[row] / totals["E0"]
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
                residual=sim_vs_e0 / paper.vs_e0 - 1,
            )
        )
    return rows


def speedup_table(seeds: Sequence[int], progress: Progress | None = None) -> list[SpeedupRow]:
    """Cumulative speedups of the elastic policy over Async and Colocate, simulated."""
    rows = []
    for setting, paper in PAPER_SPEEDUP.items():
        elastic, async_, colocate = (
            mean_total(SPEEDUP[f"{setting}-{policy}"], seeds, progress)
            for policy in ("elastic", "async", "colocate")
        )
        rows.append(
            SpeedupRow(
                setting=setting,
                steps=SPEEDUP[f"{setting}-elastic"].steps,
                elastic_h=elastic,
                async_h=async_,
                colocate_h=colocate,
                sim_vs_async=async_ / elastic,
                sim_vs_colocate=colocate / elastic,
                paper_vs_async=paper.vs_async,
                paper_vs_colocate=paper.vs_colocate,
                paper_totals_h=paper.totals_h,
            )
        )
    return rows
