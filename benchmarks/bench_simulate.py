"""Simulated steps per second for the 2.4T preset, against a trivial baseline loop.

The baseline draws the same number of workload groups with no scheduling at all, so
the ratio is the cost of the decision core plus the event loop per workload sample.
Run: .venv/bin/python benchmarks/bench_simulate.py
"""

from __future__ import annotations

import time

import numpy as np

from gyre_sched import get_preset, simulate
from gyre_sched.sim import WORKLOADS


def main() -> None:
    preset = get_preset("nl2repo-2.4t-elastic")
    workload = WORKLOADS[preset.workload]
    start = time.perf_counter()
    run = simulate(preset.sched, preset.cluster, workload, steps=preset.steps, seed=0)
    elapsed = time.perf_counter() - start
    groups = run.result.executions_finished // preset.sched.group_size + preset.sched.initial_groups

    rng = np.random.default_rng(0)
    start = time.perf_counter()
    total = 0.0
    for _ in range(groups):
        total += sum(workload.sample_group(rng, preset.sched.group_size).durations_s)
    baseline = time.perf_counter() - start

    print(
        f"preset {preset.name}: {preset.steps} steps in {elapsed:.3f} s = {preset.steps / elapsed:.1f} steps/s"
    )
    print(f"  {run.result.inputs_processed} core inputs, {run.result.executions_finished} executions")
    print(f"baseline: {groups} workload groups drawn in {baseline:.3f} s")
    print(f"ratio simulate / baseline: {elapsed / baseline:.1f}x")


if __name__ == "__main__":
    main()
