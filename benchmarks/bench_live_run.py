"""A live run's useful work, and its wall time against the simulator's prediction for it.

Runs ``gyre run`` (the demo's configuration unless ``--config``; ``--steps`` shortens it) on
real processes, then reads the run's log alone:

- useful work: the fraction of trainer-cell time spent in forward and forward-backward passes
  (``train.computed``), the fraction of rollout-engine time spent generating (model calls
  open), and where the rest went (``gyre_store.cell_time``);
- the simulator's prediction for the same configuration, fed the run's measured execution
  durations (by group), training seconds per group, update-and-publication time
  (``gyre_sched.predict_run``): real wall time / simulated wall time, both from the first
  dispatch to the last update.

There is no target for these figures; a gap between the run and the simulator is a finding
(docs/live-run.md explains the one measured here). With ``--run RUN`` it reads a run already in
the database instead of starting one.

    .venv/bin/python benchmarks/bench_live_run.py [--steps 4] [--config run.toml] [--run RUN]

The database and Redis are ``GYRE_DATABASE_URL`` and ``GYRE_REDIS_URL`` (default: a new
database on the machine's PostgreSQL, kept and printed, and its Redis, on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import psycopg

from gyre_sched import predict_run
from gyre_store import PostgresEventLog, RunConfigured, StoreConfig, cell_time, run_report
from gyre_tools.run_config import parse_config, to_toml

ROOT = Path(__file__).resolve().parent.parent


def _run(config_text: str, env: dict[str, str], folder: Path) -> str:
    (folder / "run.toml").write_text(config_text)
    command = [sys.executable, "-m", "gyre_tools.cli", "run", "--config", str(folder / "run.toml"),
               "--json", str(folder / "run.json"), "--metrics", "none"]  # fmt: skip
    print("running:", " ".join(command[2:]), flush=True)
    began = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, **env})
    if done.returncode != 0:
        raise SystemExit(f"gyre run exited {done.returncode}")
    print(f"gyre run took {time.monotonic() - began:.0f} s", flush=True)
    return str(json.loads((folder / "run.json").read_text())["run_id"])


def _fresh_database() -> str:
    """A new, migrated database on the machine's PostgreSQL (kept, so ``--run`` can read it)."""
    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    name = f"gyre_bench_live_{int(time.time())}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + "/" + name
    migrate = [sys.executable, "-m", "gyre_tools.cli", "db", "upgrade"]
    subprocess.run(migrate, cwd=ROOT, env={**os.environ, "GYRE_DATABASE_URL": url}, check=True)
    return url


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, help="a gyre run config (default: the demo's)")
    parser.add_argument("--steps", type=int, help="override the config's steps")
    parser.add_argument("--seed", dest="run_seed", type=int, help="override the config's seed")
    parser.add_argument("--run", help="read this run from the database instead of starting one")
    parser.add_argument("--sim-seed", type=int, default=0, help="the simulator's seed")
    args = parser.parse_args()

    env = {
        "GYRE_DATABASE_URL": os.environ.get("GYRE_DATABASE_URL") or _fresh_database(),
        "GYRE_REDIS_URL": os.environ.get("GYRE_REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
    print(f"database: {env['GYRE_DATABASE_URL']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gyre-bench-live-") as tmp:
        run_id = args.run
        if run_id is None:
            config = parse_config(args.config.read_text()) if args.config else parse_config("")
            if args.steps:
                config = msgspec.structs.replace(config, steps=args.steps)
            if args.run_seed is not None:
                config = msgspec.structs.replace(config, seed=args.run_seed)
            # The demo's data directory by default: its warm-started policy is cached there.
            env["GYRE_DATA_DIR"] = os.environ.get("GYRE_DATA_DIR", str(Path.home() / ".gyre"))
            run_id = _run(to_toml(config), env, Path(tmp))
        with PostgresEventLog(StoreConfig(env["GYRE_DATABASE_URL"])) as log:
            toml = next(
                r.event.config_toml
                for r in log.read(0, types=("run.configured",))
                if isinstance(r.event, RunConfigured) and r.event.run_id == run_id
            )
            config = parse_config(toml)
            report = run_report(log, run_id, phi=config.phi, mu=config.mu)
            cells = cell_time(log, run_id)
            costs, predicted = predict_run(log, run_id, config.sched(), seed=args.sim_seed)

    print(f"\nrun {run_id}: {config.policy}, K={config.cells} trainer cells, "
          f"{config.rollout_engines} engines x {config.engine_capacity}, B={config.B} N={config.N}, "
          f"{len(report.steps)} steps")  # fmt: skip
    rewards = [st.mean_reward for st in report.steps if st.mean_reward is not None]
    third = max(1, len(rewards) // 3)
    if rewards:
        first, last = sum(rewards[:third]) / third, sum(rewards[-third:]) / third
        print(f"reward: first third {first:.3f}, last third {last:.3f}, gain {last - first:+.3f}")
    for held in report.held_out:
        rate = "n/a" if held.pass_rate is None else f"{held.pass_rate:.3f}"
        print(f"held-out {held.name}: pass rate {rate} ({held.passed}/{held.executions})")
    print("\nuseful work (seconds, from the log)")
    print(f"  {'cell':<26} {'span':>8}  parts")
    for c in cells.trainers + cells.engines:
        parts = "  ".join(f"{k} {v:.1f} ({v / c.span_s:.0%})" for k, v in c.parts.items())
        print(f"  {c.name:<26} {c.span_s:8.1f}  {parts}")
    print(f"  trainer cells in forward/backward: {cells.trainer_fraction:.1%}")
    print(f"  rollout engines generating:        {cells.engine_fraction:.1%}")

    cluster = costs.cluster
    real = report.wall_s or 0.0
    simulated = predicted.step_end_s[-1] if predicted.step_end_s else predicted.total_h * 3600
    print("\nsimulator fed this run's measurements")
    print(f"  training: {costs.compute_s:.1f} s of passes over {costs.groups} groups "
          f"({cluster.train_node_hours_per_group * 3600:.2f} s/group, {cluster.microsteps_per_group} micro-steps/group); "
          f"update and publication {cluster.update_s:.2f} s")  # fmt: skip
    print(f"  real wall time       {real:8.1f} s  (run.started -> last update)")
    print(f"  simulated wall time  {simulated:8.1f} s")
    print(
        f"  real / simulated     {real / simulated:8.2f}" if simulated > 0 else "  simulated wall time is 0"
    )
    real_steps = [s.wall_s for s in report.steps if s.wall_s is not None]
    sim_steps = [h * 3600 for h in predicted.step_durations_h]
    for i, (r, s) in enumerate(zip(real_steps, sim_steps, strict=False)):
        print(f"    step {i}: real {r:6.1f} s  simulated {s:6.1f} s")
    print(f"  staleness: measured {report.staleness.measured_mean}, simulated {predicted.mean_staleness:.2f}, "
          f"E[d] {report.staleness.expected_mean}")  # fmt: skip


if __name__ == "__main__":
    main()
