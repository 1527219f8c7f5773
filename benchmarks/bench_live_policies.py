"""One live workload under async, colocate and elastic: wall time per step, measured staleness,
transitions and where their time goes, and the simulator's prediction for each run.

Runs ``gyre run`` once per policy, on real processes, with one workload (the demo's task family
and warm-started policy) and one budget of four model hosts: elastic and colocate get three
cells that move between rollout and training beside one pool engine, async one trainer cell
beside three pool engines. The three run at the same target staleness E[d] = 1, with the
paper's pairings (async (phi, mu) = (1, 1), colocate (0, 3), elastic (0.5, 2)). Everything
printed is read from each run's log. The simulator runs each configuration twice:

- fed that run's own measured execution durations, training seconds per group,
  update-and-publication time and transition times (``gyre_sched.predict_run``): a fit, whose
  agreement with the run is partly built in, since the run's own costs go in;
- with ``--predict-from FILE`` (the costs file an earlier run of this benchmark wrote, on
  another seed), from that run's costs of the same policy alone: a prediction, made and
  printed before the policy's run starts.

Every run writes its measured costs to ``--out``/costs-seed<S>.json (``out/`` is not
committed), for the next seed's ``--predict-from``.

There is no numeric target: the paper's ordering (elastic faster than colocate and than
async) is printed as HOLDS or DOES NOT HOLD with the figures behind it, and the transition
times beside the paper's 8.52 s to training and 3.46 s back.

    .venv/bin/python benchmarks/bench_live_policies.py [--steps 6] [--seed 0] [--policies elastic,async]
        [--predict-from out/bench_live_policies/costs-seed<T>.json]

The database is a scratch one on ``--pg`` (default: the machine's PostgreSQL), dropped after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import live_costs
from live_costs import CostsFileError, RunCosts
from scratch import scratch_database

from gyre_sched import SimResult, predict_run
from gyre_store import PostgresEventLog, StoreConfig, run_report
from gyre_tools.run_config import parse_config

ROOT = Path(__file__).resolve().parent.parent
PAPER_TO_TRAINING_S, PAPER_TO_ROLLOUT_S = 8.52, 3.46

SHAPES = {
    "elastic": ("cells = 3\nrollout_engines = 1", 0.5, 2),
    "colocate": ("cells = 3\nrollout_engines = 1", 0.0, 3),
    "async": ("cells = 1\nrollout_engines = 3", 1.0, 1),
}

CONFIG = """
seed = {seed}
steps = {steps}
policy = "{policy}"
phi = {phi}
mu = {mu}
B = 4
N = 4
{shape}
engine_capacity = 6
tau_s = 0.0
harness = "builtin"
[tasks]
train = 32
heldout = 2
budget_s = 90
[eval]
heldout = false
"""


def _config_text(policy: str, args: argparse.Namespace) -> str:
    shape, phi, mu = SHAPES[policy]
    return CONFIG.format(seed=args.seed, steps=args.steps, policy=policy, phi=phi, mu=mu, shape=shape)


def _predict(policy: str, earlier: dict[str, RunCosts], args: argparse.Namespace) -> SimResult | None:
    """The prediction for ``policy`` from another seed's costs of it, printed; None without."""
    if policy not in earlier:
        if args.predict_from:
            print(f"{policy}: no prediction, {args.predict_from} holds no {policy} run", flush=True)
        return None
    try:
        predicted = live_costs.predict(
            earlier[policy], parse_config(_config_text(policy, args)), sim_seed=args.sim_seed
        )
    except CostsFileError as exc:
        raise SystemExit(f"--predict-from, {policy}: {exc}") from exc
    print(f"{policy}: predicted before the runs, from seed {earlier[policy].seed}'s costs alone: "
          f"{live_costs.simulated_s(predicted):.1f} s", flush=True)  # fmt: skip
    return predicted


def _run(policy: str, args: argparse.Namespace, url: str, folder: Path) -> dict[str, Any]:
    _, phi, mu = SHAPES[policy]
    config = folder / f"{policy}.toml"
    config.write_text(_config_text(policy, args))
    out = folder / f"{policy}.json"
    env = {
        **os.environ,
        "GYRE_DATABASE_URL": url,
        "GYRE_REDIS_URL": os.environ.get("GYRE_REDIS_URL", "redis://127.0.0.1:6379/0"),
        # The demo's data directory: its warm-started policy is cached there.
        "GYRE_DATA_DIR": os.environ.get("GYRE_DATA_DIR", str(Path.home() / ".gyre")),
    }
    command = [sys.executable, "-m", "gyre_tools.cli", "run", "--config", str(config), "--json", str(out),
               "--metrics", "none", "--quiet"]  # fmt: skip
    print(f"== {policy}: (phi, mu) = ({phi}, {mu})", flush=True)
    began = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise SystemExit(f"gyre run ({policy}) exited {done.returncode}")
    print(f"   gyre run took {time.monotonic() - began:.0f} s", flush=True)
    summary: dict[str, Any] = json.loads(out.read_text())
    summary["config_toml"] = config.read_text()
    return summary


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6, help="training steps (a multiple of every mu: 6)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default="elastic,colocate,async")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    live_costs.add_arguments(parser, "bench_live_policies")
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if unknown := set(policies) - SHAPES.keys():
        parser.error(f"unknown policies {sorted(unknown)}; choose from {', '.join(SHAPES)}")
    earlier = live_costs.load_argument(parser, args)
    # Made and printed before any run starts, so nothing of these runs can go into them.
    ahead = {policy: _predict(policy, earlier, args) for policy in policies}

    rows: dict[str, dict[str, Any]] = {}
    measured: dict[str, RunCosts] = {}
    with scratch_database(args.pg, "gyre_bench_policies") as url, tempfile.TemporaryDirectory() as tmp:
        for policy in policies:
            load_before = os.getloadavg()[0]
            before = ahead[policy]
            summary = _run(policy, args, url, Path(tmp))
            run_id = summary["run_id"]
            config = parse_config(summary["config_toml"])
            with PostgresEventLog(StoreConfig(url)) as log:
                report = run_report(log, run_id, phi=config.phi, mu=config.mu)
                costs, predicted = predict_run(log, run_id, config.sched(), seed=args.sim_seed)
                measured[policy] = live_costs.measured(log, run_id, summary["config_toml"], costs.cluster)
            rows[policy] = {
                "summary": summary,
                "report": report,
                "simulated_s": live_costs.simulated_s(predicted),
                "predicted": predicted,
                "before_s": live_costs.simulated_s(before) if before else None,
                "costs": costs,
                "load": (load_before, os.getloadavg()[0]),
            }
    costs_file = live_costs.save(args.out, args.seed, measured)

    print(
        "\nthe same workload, live (every figure from the run's log) beside the simulator: fed each run's own"
        "\nmeasurements (sim s, a fit) and, with --predict-from, from another seed's (pred s, made before the run)"
    )
    header = (f"{'policy':<9} {'(phi,mu)':>9} {'steps':>5} {'run s':>7} {'s/step':>7} {'sim s':>7} {'real/sim':>8} "
              f"{'pred s':>7} {'real/pred':>9} {'staleness':>9} {'E[d]':>5} {'sim d':>6} {'moves':>5} {'train s':>8} "
              f"{'s/micro':>8} {'cells':>5} {'load':>9}")  # fmt: skip
    print(header)
    for policy, row in rows.items():
        s, report = row["summary"], row["report"]
        real = report.wall_s
        steps = len(report.steps)
        _, phi, mu = SHAPES[policy]
        before_s = row["before_s"]
        print(
            f"{policy:<9} {f'({phi},{mu})':>9} {steps:>5} {_fmt(real):>7} {_fmt(real / steps if real else None):>7} "
            f"{_fmt(row['simulated_s']):>7} {_fmt(real / row['simulated_s'] if real else None, digits=2):>8} "
            f"{_fmt(before_s):>7} {_fmt(real / before_s if real and before_s else None, digits=2):>9} "
            f"{_fmt(report.staleness.measured_mean, digits=2):>9} {report.staleness.expected_mean:>5.2f} "
            f"{row['predicted'].mean_staleness:>6.2f} {s['transitions']:>5} {row['costs'].compute_s:>8.1f} "
            f"{row['costs'].compute_s / max(1, 2 * row['costs'].micro_steps):>8.3f} "
            f"{max((st.roles.get('training', 0) for st in report.steps), default=0):>5} "
            f"{'{:.1f}-{:.1f}'.format(*row['load']):>9}"
        )
    print(
        "  sim s: the simulator fed this run's own measured costs (a fit: the agreement is partly built in);"
    )
    print("  pred s: predicted before the run from another seed's costs of the same policy (--predict-from);")
    print(
        "  train s: forward and forward-backward seconds of every trainer cell (train.computed); s/micro: per pass"
    )
    print("  of a micro-step (two passes each); cells: most cells in training at a step's start;")
    print("  load: the 1-minute load average as the run started and as it ended")
    print(f"this run's costs: {costs_file} (--predict-from for a run on another seed)")

    for policy, row in rows.items():
        times = row["report"].transition_times
        if not times:
            continue
        print(f"\n{policy}: transition times (s), median over {len(times)} transitions [min-max]")
        for direction, paper in (("to_training", PAPER_TO_TRAINING_S), ("to_rollout", PAPER_TO_ROLLOUT_S)):
            mine = [t for t in times if t.direction == direction and t.total_s is not None]
            if not mine:
                continue
            totals = [t.total_s for t in mine if t.total_s is not None]
            phases = sorted({k for t in mine for k in t.phases})
            split = "  ".join(
                f"{k} {statistics.median([t.phases[k] for t in mine if k in t.phases]):.3f}" for k in phases
            )
            print(f"  {direction:<12} {statistics.median(totals):6.3f} [{min(totals):.3f}-{max(totals):.3f}]"
                  f" (paper {paper} s): {split}")  # fmt: skip

    if {"elastic", "colocate", "async"} <= rows.keys():
        wall = {p: rows[p]["report"].wall_s for p in rows}
        for other in ("colocate", "async"):
            holds = wall["elastic"] is not None and wall[other] is not None and wall["elastic"] < wall[other]
            ratio = wall[other] / wall["elastic"] if wall["elastic"] and wall[other] else None
            print(f"elastic < {other}: {'HOLDS' if holds else 'DOES NOT HOLD'} "
                  f"(elastic {_fmt(wall['elastic'])} s, {other} {_fmt(wall[other])} s, "
                  f"speedup {_fmt(ratio, 'x', 2)})")  # fmt: skip


if __name__ == "__main__":
    main()
