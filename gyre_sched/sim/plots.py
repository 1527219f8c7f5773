"""Matplotlib figures of simulated runs, written to files with the Agg backend.

Three figures: the role timeline of every cell, step durations with cumulative
speedup against the baselines, and the waterlevel against C_R - C_e.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gyre_sched.decision import Direction
from gyre_sched.sim.results import SimResult, cumulative_speedup
from gyre_sched.sim.workload import HOUR


def role_timeline(result: SimResult, path: Path) -> Path:
    """One row per cell: training spans filled, transitions in grey."""
    fig, ax = plt.subplots(figsize=(10, 0.5 * result.cells + 1.5))
    end = result.total_h
    start_train: dict[int, float] = {}
    for t in result.transitions:
        begin, done = t.at_s / HOUR, (t.done_s if t.done_s is not None else t.at_s) / HOUR
        ax.broken_barh([(begin, max(done - begin, 1e-3))], (t.cell - 0.4, 0.8), color="grey")
        if t.direction is Direction.TO_TRAIN:
            start_train[t.cell] = done
        elif t.cell in start_train:
            s = start_train.pop(t.cell)
            ax.broken_barh([(s, begin - s)], (t.cell - 0.4, 0.8), color="tab:red")
    for cell, s in start_train.items():
        ax.broken_barh([(s, end - s)], (cell - 0.4, 0.8), color="tab:red")
    if result.policy == "async":
        for cell in range(result.cells):
            ax.broken_barh([(0, end)], (cell - 0.4, 0.8), color="tab:red")
    ax.set_xlim(0, end)
    ax.set_yticks(range(result.cells), [("core" if c == 0 else f"cell {c}") for c in range(result.cells)])
    ax.set_xlabel("hours (red: training, white: rollout)")
    ax.set_title(f"{result.name}: role timeline")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def steps_and_speedup(result: SimResult, baselines: Sequence[SimResult], path: Path) -> Path:
    """Step durations of every run, and the candidate's cumulative speedup over each baseline."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for run in (result, *baselines):
        top.plot(range(1, len(run.step_durations_h) + 1), run.step_durations_h, marker=".", label=run.name)
    top.set_ylabel("step duration (h)")
    top.legend()
    for base in baselines:
        speedup = cumulative_speedup(base, result)
        bottom.plot(range(1, len(speedup) + 1), speedup, label=f"vs {base.name}")
    bottom.axhline(1.0, color="black", linewidth=0.5)
    bottom.set_xlabel("training step")
    bottom.set_ylabel("cumulative speedup")
    if baselines:
        bottom.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def waterlevel(result: SimResult, path: Path) -> Path:
    """w(t) against the join threshold C_R(t) - C_e, and k(t)."""
    fig, ax = plt.subplots(figsize=(10, 4))
    times = [s.at_s / HOUR for s in result.waterlevel]
    ax.step(times, [s.w for s in result.waterlevel], where="post", label="waterlevel w = d - f")
    ax.step(times, [s.headroom for s in result.waterlevel], where="post", label="C_R - C_e")
    ax.set_xlabel("hours")
    ax.set_ylabel("executions")
    twin = ax.twinx()
    twin.step(times, [s.training_cells for s in result.waterlevel], where="post", color="tab:red", alpha=0.4)
    twin.set_ylabel("k (cells not in rollout)")
    ax.legend(loc="upper right")
    ax.set_title(f"{result.name}: waterlevel")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
