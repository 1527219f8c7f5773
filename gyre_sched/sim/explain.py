"""``python -m gyre_sched.sim.explain``: where a preset's simulated time goes, by cause.

Runs a preset for a few seeds and prints the time account of ``gyre_sched.sim.time_use``
(the first step of each burst apart from the others) and, for seed 0, what each burst's
last consumed group waited for (``burst_readiness``). Optional what-ifs: another
training cost, another cell capacity, or every scheduling overhead set to zero. The
what-ifs measure a mechanism's share; they are not calibrations.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import msgspec

from gyre_sched.sim.presets import WORKLOADS, get_preset
from gyre_sched.sim.simulator import simulate
from gyre_sched.sim.time_use import burst_readiness, format_account, format_readiness


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, simulate, print; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m gyre_sched.sim.explain", description=__doc__)
    parser.add_argument("--preset", default="ablation-E0")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1")
    parser.add_argument("--train-cost", type=float, help="node-hours per group (what-if)")
    parser.add_argument("--cell-capacity", type=int, help="C_e (what-if)")
    parser.add_argument(
        "--no-overheads",
        action="store_true",
        help="what-if: update, broadcast, publication, pipeline, transitions and tau all zero",
    )
    args = parser.parse_args(argv)
    preset = get_preset(args.preset)
    sched, cluster = preset.sched, preset.cluster
    if args.train_cost is not None:
        cluster = msgspec.structs.replace(cluster, train_node_hours_per_group=args.train_cost)
    if args.cell_capacity is not None:
        sched = msgspec.structs.replace(sched, cell_capacity=args.cell_capacity)
    if args.no_overheads:
        cluster = msgspec.structs.replace(
            cluster,
            update_s=0.0,
            broadcast_s=0.0,
            publish_s=0.0,
            pipeline_s=0.0,
            to_train_s=0.0,
            to_rollout_s=0.0,
        )
        sched = msgspec.structs.replace(sched, tau_s=0.0)
    runs = []
    hours = []
    for seed in range(args.seeds):
        run = simulate(
            sched, cluster, WORKLOADS[preset.workload], steps=preset.steps, seed=seed, keep_log=True
        )
        runs.append(run.result.time_use)
        hours.append(run.result.total_h)
        if seed == 0:
            bursts = burst_readiness(sched, run.log, run.result.step_end_s)
    print(format_account(preset.name, runs, sched.mu))
    print(f"simulated total {sum(hours) / len(hours):.2f} h (seeds: {', '.join(f'{h:.2f}' for h in hours)})")
    print(
        f"what each burst waited for (seed 0; hours from the burst's dispatch):\n{format_readiness(bursts)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
