"""``gyre simulate``: run the cluster simulator over the scheduling decision core.

Arguments, then the preset and overrides, then the run(s), then tables, JSON and plots.
All simulation logic lives in gyre_sched; this module only parses and prints.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from gyre_sched import (
    WORKLOADS,
    GyreSchedError,
    PolicyKind,
    Preset,
    SimResult,
    cumulative_speedup,
    dispatch_params,
    get_preset,
    load_workload,
    simulate,
)
from gyre_sched.sim import (
    ABLATION,
    ABLATION_NOTE,
    MET_TOLERANCE,
    PAPER_SPEEDUP_NOT_SIMULATED,
    PRESETS,
    SPEEDUP_NOTE,
    TRAIN_NODE_HOURS_PER_GROUP_2_4T,
    TRAIN_NODE_HOURS_PER_GROUP_122B,
    AblationRow,
    Calibration,
    SpeedupRow,
    WorkloadModel,
    ablation_table,
    calibrate,
    planned_runs,
    role_timeline,
    speedup_table,
    steps_and_speedup,
    waterlevel,
    with_costs,
    with_policy,
    workload_from_run,
)
from gyre_store import GyreStoreError
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, open_store

TABLE_PRESETS = ("ablation-table", "speedup-table")
DEFAULT_PRESET = "ablation-E0"


def register(subparsers: Any) -> None:
    """Add the ``simulate`` parser."""
    p = subparsers.add_parser(
        "simulate",
        help="simulate a cluster driven by the scheduling decision core",
        description="Discrete-event simulation of elastic, Colocate or Async scheduling. "
        f"Presets: {', '.join([*TABLE_PRESETS, *sorted(PRESETS)])}.",
    )
    env = add_env_argument
    env(
        p,
        "--preset",
        "GYRE_SIM_PRESET",
        help="named preset; ablation-table and speedup-table print the paper's tables",
    )
    env(p, "--policy", "GYRE_SIM_POLICY", help="elastic, colocate or async (overrides the preset)")
    env(p, "--phi", "GYRE_SIM_PHI", type=float, help="extra dispatch phi in units of B")
    env(p, "--mu", "GYRE_SIM_MU", type=int, help="training steps per burst")
    env(
        p,
        "--staleness",
        "GYRE_SIM_STALENESS",
        type=float,
        help="target E[d]; derives (phi, mu) for the policy",
    )
    env(p, "--cells", "GYRE_SIM_CELLS", type=int, help="K, the number of cells")
    env(p, "--cell-capacity", "GYRE_SIM_CELL_CAPACITY", type=int, help="C_e, executions per cell in rollout")
    env(p, "--pool-capacity", "GYRE_SIM_POOL_CAPACITY", type=int, help="C_s, executions in the separate pool")
    env(p, "--cell-nodes", "GYRE_SIM_CELL_NODES", type=int, help="nodes per cell (training speed)")
    env(p, "--group-size", "GYRE_SIM_GROUP_SIZE", type=int, help="N executions per group")
    env(p, "--batch-groups", "GYRE_SIM_BATCH_GROUPS", type=int, help="B groups per step")
    env(p, "--rho-min", "GYRE_SIM_RHO_MIN", type=float, help="supply threshold as a fraction of B")
    env(p, "--tau", "GYRE_SIM_TAU", type=float, help="seconds the supply check must hold")
    env(p, "--train-cost", "GYRE_SIM_TRAIN_COST", type=float, help="node-hours of training per group")
    env(p, "--streaming", "GYRE_SIM_STREAMING", choices=("on", "off"), help="streaming training on or off")
    env(p, "--to-train-s", "GYRE_SIM_TO_TRAIN_S", type=float, help="rollout->training overhead in seconds")
    env(
        p, "--to-rollout-s", "GYRE_SIM_TO_ROLLOUT_S", type=float, help="training->rollout overhead in seconds"
    )
    env(p, "--publish-s", "GYRE_SIM_PUBLISH_S", type=float, help="weight publication time in seconds")
    env(
        p,
        "--workload",
        "GYRE_SIM_WORKLOAD",
        help=f"{' or '.join(WORKLOADS)}, or a .csv/.json file of durations",
    )
    env(
        p,
        "--workload-from-run",
        "GYRE_SIM_WORKLOAD_FROM_RUN",
        help="resample the durations and outcomes of this stored run's executions (needs the store)",
    )
    add_store_arguments(p)
    env(p, "--steps", "GYRE_SIM_STEPS", type=int, help="training steps to simulate")
    env(p, "--seed", "GYRE_SIM_SEED", type=int, default="0", help="random seed")
    env(
        p, "--seeds", "GYRE_SIM_SEEDS", type=int, default="3", help="seeds averaged per row of a table preset"
    )
    env(p, "--json", "GYRE_SIM_JSON", help="JSON output file (default OUT/<name>.json)")
    env(p, "--out", "GYRE_SIM_OUT", default="out/simulate", help="folder for JSON and plots")
    env(p, "--plots", "GYRE_SIM_PLOTS", choices=("on", "off"), default="on", help="write matplotlib plots")
    p.add_argument(
        "--fit",
        action="store_true",
        help="refit the calibration (workload profiles, then training costs on the training rows), "
        "print training and held-out residuals, write JSON; exit 1 if presets.py holds other values",
    )
    p.set_defaults(func=run)


def _override(preset: Preset, args: argparse.Namespace) -> Preset:
    s, c = preset.sched, preset.cluster
    sched_fields = {
        "cells": args.cells,
        "cell_capacity": args.cell_capacity,
        "pool_capacity": args.pool_capacity,
        "group_size": args.group_size,
        "batch_groups": args.batch_groups,
        "rho_min": args.rho_min,
        "tau_s": args.tau,
        "phi": args.phi,
        "mu": args.mu,
    }
    if args.policy is not None:
        sched_fields["policy"] = PolicyKind(args.policy)
    if args.staleness is not None:
        policy = PolicyKind(args.policy) if args.policy else s.policy
        phi, mu = dispatch_params(policy, args.staleness, args.mu if args.mu is not None else s.mu)
        sched_fields["phi"], sched_fields["mu"] = phi, mu
    cluster_fields = {
        "cell_nodes": args.cell_nodes,
        "train_node_hours_per_group": args.train_cost,
        "to_train_s": args.to_train_s,
        "to_rollout_s": args.to_rollout_s,
        "publish_s": args.publish_s,
        "streaming": None if args.streaming is None else args.streaming == "on",
    }
    sched = msgspec.structs.replace(s, **{k: v for k, v in sched_fields.items() if v is not None})
    cluster = msgspec.structs.replace(c, **{k: v for k, v in cluster_fields.items() if v is not None})
    steps = args.steps if args.steps is not None else preset.steps
    changed = sched != s or cluster != c or steps != preset.steps
    name = f"{preset.name}-custom" if changed else preset.name
    return msgspec.structs.replace(preset, name=name, sched=sched, cluster=cluster, steps=steps)


def _workload(spec: str, args: argparse.Namespace | None = None) -> WorkloadModel:
    if args is not None and args.workload_from_run:
        with open_store(args, upgrade=False) as opened:
            return workload_from_run(opened.log, args.workload_from_run)
    if spec in WORKLOADS:
        return WORKLOADS[spec].validate()
    return load_workload(Path(spec))


def _run_one(preset: Preset, workload: WorkloadModel, seed: int, console: Console) -> SimResult:
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"simulating {preset.name}", total=preset.steps)
        run = simulate(
            preset.sched,
            preset.cluster,
            workload,
            steps=preset.steps,
            seed=seed,
            name=preset.name,
            on_step=lambda done: progress.update(task, completed=done),
        )
    return run.result


def _single(args: argparse.Namespace, console: Console, out: Path) -> int:
    preset = _override(get_preset(args.preset or DEFAULT_PRESET), args)
    workload = _workload(args.workload or preset.workload, args)
    result = _run_one(preset, workload, args.seed, console)
    baselines: list[SimResult] = []
    if preset.sched.policy is PolicyKind.ELASTIC:
        for policy in (PolicyKind.ASYNC, PolicyKind.COLOCATE):
            try:
                base = with_policy(preset, policy)
                base = msgspec.structs.replace(base, steps=preset.steps)
                baselines.append(_run_one(base, workload, args.seed, console))
            except GyreSchedError as exc:
                console.print(f"[yellow]no {policy.value} baseline: {exc}[/yellow]")
    table = Table(
        title=f"{result.name} ({result.policy}, phi={result.phi:g}, mu={result.mu}, seed {result.seed})"
    )
    table.add_column("step", justify="right")
    table.add_column("duration (h)", justify="right")
    table.add_column("cumulative (h)", justify="right")
    for base in baselines:
        table.add_column(f"speedup vs {base.policy}", justify="right")
    speedups = [cumulative_speedup(base, result) for base in baselines]
    for i, duration in enumerate(result.step_durations_h):
        extra = [f"{s[i]:.3f}" if i < len(s) else "" for s in speedups]
        table.add_row(str(i + 1), f"{duration:.2f}", f"{result.step_end_s[i] / 3600:.2f}", *extra)
    console.print(table)
    console.print(
        f"total {result.total_h:.2f} h; mean staleness {result.mean_staleness:.3f} "
        f"(boundary dispatch expects {result.expected_staleness:.3f} in steady state); "
        f"{len(result.transitions)} transitions, {result.reroutes} reroutes"
    )
    for base in baselines:
        console.print(
            f"{base.policy} baseline: {base.total_h:.2f} h, speedup {base.total_h / result.total_h:.3f}"
        )
    path = Path(args.json) if args.json else out / f"{result.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "preset": msgspec.to_builtins(preset),
        "result": msgspec.to_builtins(result),
        "baselines": [msgspec.to_builtins(b) for b in baselines],
    }
    path.write_bytes(msgspec.json.encode(document))
    console.print(f"wrote {path}")
    if args.plots == "on":
        out.mkdir(parents=True, exist_ok=True)
        for written in (
            role_timeline(result, out / f"{result.name}-roles.png"),
            steps_and_speedup(result, baselines, out / f"{result.name}-steps.png"),
            waterlevel(result, out / f"{result.name}-waterlevel.png"),
        ):
            console.print(f"wrote {written}")
    return 0


def _verdict(residual: float) -> str:
    return "MET" if abs(residual) <= MET_TOLERANCE else "MISSED"


def _range(paper: tuple[float, float]) -> str:
    lo, hi = paper
    return f"{lo:.2f}" if lo == hi else f"{lo:.2f}-{hi:.2f}"


def ablation_rich_table(rows: list[AblationRow], title: str) -> Table:
    """The ablation as printed (and copied into README.md, with ``ABLATION_NOTE`` under it)."""
    table = Table(title=title)
    for column in (
        "row",
        "setting",
        "(phi,mu)",
        "paper h",
        "sim h",
        "paper vs E0",
        "sim vs E0",
        "residual",
        "role",
        "verdict",
    ):
        table.add_column(
            column, justify="left" if column in ("row", "setting", "role", "verdict") else "right"
        )
    for r in rows:
        table.add_row(
            r.row,
            r.description,
            f"({r.phi:g},{r.mu})",
            f"{r.paper_total_h:.2f}",
            f"{r.sim_total_h:.2f}",
            f"{r.paper_vs_e0:.3f}",
            f"{r.sim_vs_e0:.3f}",
            f"{r.residual:+.1%}",
            r.role.value,
            "" if r.row == "E0" else _verdict(r.residual),
        )
    return table


def speedup_rich_table(rows: list[SpeedupRow], title: str) -> Table:
    """Paper Table 1, one line per comparison; the rows with no workload to simulate say so
    (copied into README.md with ``SPEEDUP_NOTE`` under it)."""
    table = Table(title=title)
    for column in ("setting", "vs", "sim h (E / baseline)", "paper", "sim", "residual", "role", "verdict"):
        table.add_column(
            column, justify="left" if column in ("setting", "vs", "role", "verdict") else "right"
        )
    for r in rows:
        for baseline, hours, paper, sim, off, role in (
            ("Async", r.async_h, r.paper_vs_async, r.sim_vs_async, r.residual_vs_async, r.role_vs_async),
            (
                "Colocate",
                r.colocate_h,
                r.paper_vs_colocate,
                r.sim_vs_colocate,
                r.residual_vs_colocate,
                r.role_vs_colocate,
            ),
        ):
            table.add_row(
                f"{r.setting} ({r.steps} steps)",
                baseline,
                f"{r.elastic_h:.1f} / {hours:.1f}",
                _range(paper),
                f"{sim:.3f}",
                f"{off:+.1%}",
                role.value,
                _verdict(off),
            )
    for (workload, target), pair in PAPER_SPEEDUP_NOT_SIMULATED.items():
        for baseline, paper in zip(("Async", "Colocate"), pair, strict=True):
            setting = escape(f"{workload}, E[d]={target:g}")  # "[d]" is not rich markup
            table.add_row(setting, baseline, "", f"{paper:.3f}", "", "", "", "not simulated")
    return table


def _tables(args: argparse.Namespace, console: Console, out: Path) -> int:
    seeds = list(range(args.seed, args.seed + args.seeds))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"simulating {args.preset}", total=None)
        advance = lambda _: progress.advance(task)  # noqa: E731
        rows: list[Any]
        if args.preset == "ablation-table":
            # --train-cost replaces the one fitted cost of every row (a what-if, not the README's table)
            costs = {} if args.train_cost is None else {"nl2repo-122b": args.train_cost}
            rows = ablation_table(seeds, advance, presets=with_costs(ABLATION, costs))
        else:
            rows = speedup_table(seeds, advance)
    if args.preset == "ablation-table":
        console.print(ablation_rich_table(rows, f"scheduling ablation, 12 steps, mean of {len(seeds)} seeds"))
        console.print(ABLATION_NOTE)
    else:
        console.print(
            speedup_rich_table(rows, f"cumulative speedup of the elastic policy, mean of {len(seeds)} seeds")
        )
        console.print(SPEEDUP_NOTE)
    path = Path(args.json) if args.json else out / f"{args.preset}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode({"preset": args.preset, "seeds": seeds, "rows": rows}))
    console.print(f"wrote {path}")
    return 0


def _preset_mismatches(calibration: Calibration) -> list[str]:
    """What presets.py holds that the fit did not produce."""
    found = []
    for fit in calibration.workloads:
        held = WORKLOADS[fit.workload]
        if held != fit.model:
            found.append(f"WORKLOADS[{fit.workload!r}] is {held}, the fit gives {fit.model}")
    held_costs = {
        "nl2repo-122b": TRAIN_NODE_HOURS_PER_GROUP_122B,
        "nl2repo-2.4t": TRAIN_NODE_HOURS_PER_GROUP_2_4T,
    }
    for cost in calibration.costs:
        if abs(held_costs[cost.workload] - cost.value) > 1e-9:
            found.append(
                f"the {cost.workload} training cost is {held_costs[cost.workload]}, the fit gives {cost.value}"
            )
    return found


def _fit(args: argparse.Namespace, console: Console, out: Path) -> int:
    seeds = list(range(args.seed, args.seed + args.seeds))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("fitting the calibration", total=planned_runs(len(seeds)))
        calibration = calibrate(seeds, lambda _: progress.advance(task))
    for fit in calibration.workloads:
        table = Table(title=f"workload {fit.workload}: fitted {', '.join(fit.free)}")
        for column in ("figure", "paper", "model", "residual"):
            table.add_column(column, justify="left" if column == "figure" else "right")
        for f in fit.figures:
            table.add_row(f.name, f"{f.paper:.4g}", f"{f.model:.4g}", f"{f.residual:+.1%}")
        console.print(table)
        console.print(f"  {fit.model}")
    for cost in calibration.costs:
        scanned = ", ".join(f"{p.value:g}: {p.loss:.3f}" for p in cost.scan)
        console.print(
            f"{cost.workload} training cost {cost.value:g} node-h per group "
            f"(RMS log residual {cost.loss:.3f} on {', '.join(cost.training)}); scanned {scanned}"
        )
    console.print(ablation_rich_table(list(calibration.ablation), f"ablation, mean of {len(seeds)} seeds"))
    console.print(ABLATION_NOTE)
    console.print(speedup_rich_table(list(calibration.speedups), f"speedups, mean of {len(seeds)} seeds"))
    console.print(SPEEDUP_NOTE)
    path = Path(args.json) if args.json else out / "fit.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(calibration)))
    console.print(f"wrote {path}")
    mismatches = _preset_mismatches(calibration)
    for line in mismatches:
        console.print(f"[yellow]{line}[/yellow]")
    return 1 if mismatches else 0


def run(args: argparse.Namespace) -> int:
    """Run ``gyre simulate``; exit status 2 for infeasible settings or bad input."""
    # a pipe gets 80 columns by default, too narrow for the tables
    console = Console(width=max(140, shutil.get_terminal_size().columns))
    out = Path(args.out)
    try:
        if args.fit:
            return _fit(args, console, out)
        if args.preset in TABLE_PRESETS:
            return _tables(args, console, out)
        return _single(args, console, out)
    except (GyreSchedError, GyreStoreError) as exc:
        print(f"gyre simulate: error: {exc}", file=sys.stderr)
        return 2
