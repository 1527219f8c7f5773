"""A live run's useful work, and its wall time against the simulator's prediction for it.

Runs ``gyre run`` (the demo's configuration unless ``--config``; ``--steps`` shortens it) on
real processes, then reads the run's log alone:

- useful work: the fraction of trainer-cell time spent in forward and forward-backward passes
  (``train.computed``), the fraction of rollout-engine time spent generating (model calls
  open), and where the rest went (``gyre_store.cell_time``);
- the simulator fed this same run's measured execution durations (by group), training
  seconds per group and update-and-publication time (``gyre_sched.predict_run``): real wall
  time / simulated wall time. This is a fit, not a prediction: the run's own costs go in, so
  part of the agreement is built in;
- with ``--predict-from FILE`` (the costs file an earlier run of this benchmark wrote, on
  another seed of the same configuration), the simulator's prediction made from those costs
  alone, printed before the run starts, and real wall time / predicted wall time after it.

Every run writes the costs it measured to ``--out``/costs-seed<S>.json (``out/`` is not
committed), for the next seed's ``--predict-from``. There is no target for these figures; a gap
between the run and the simulator is a finding, not a failure. With ``--run RUN`` it reads a
run already in the database instead of starting one (the prediction is then made after the
run, still from the other seed's costs only).

    .venv/bin/python benchmarks/bench_live_run.py [--steps 4] [--config run.toml] [--run RUN]
        [--seed S] [--predict-from out/bench_live_run/costs-seed<T>.json]

With ``--engine reference|sglang|both`` it measures the rollout engines instead: generated
tokens per second (``engine_rate``: every recorded model call's output tokens over the rollout
phase, the first call's start to the last call's end) of one configuration (``--config``, else
``engine_rate.ENGINE_CONFIG``: 2 steps, 2 engines x 4, 64 tokens a call) on one checkpoint
(``--checkpoint``, else a tiny Qwen3.6 written by ``write_checkpoint``; ``--family qwen3`` for a
Qwen3 one, which a live run's reference engine refuses today), the run's ``engine`` set
to each kind in turn and nothing else changed. ``both`` runs the reference engine, then SGLang,
in one invocation, and prints SGLang / reference with MET or MISSED against
``engine_rate.TARGET`` (at least 1.0x). The simulator's report is not printed on this path.

    .venv/bin/python benchmarks/bench_live_run.py --engine both [--checkpoint DIR] [--steps 2]

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

import engine_rate
import live_costs
import msgspec
from databases import fresh_database
from live_costs import CostsFileError, RunCosts

from gyre_sched import SimResult, predict_run
from gyre_store import PostgresEventLog, RunConfigured, StoreConfig, cell_time, run_report
from gyre_tools.run_config import RunConfig, parse_config, to_toml

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


def _predict(other: RunCosts | None, config: RunConfig, sim_seed: int) -> SimResult | None:
    """The prediction from another seed's costs, printed; None without a costs file."""
    if other is None:
        return None
    try:
        predicted = live_costs.predict(other, config, sim_seed=sim_seed)
    except CostsFileError as exc:
        raise SystemExit(f"--predict-from: {exc}") from exc
    print(f"prediction from the costs measured on seed {other.seed} (run {other.run_id}), made before "
          f"this run's measurements: {live_costs.simulated_s(predicted):.1f} s for {config.steps} steps",
          flush=True)  # fmt: skip
    return predicted


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, help="a gyre run config (default: the demo's)")
    parser.add_argument("--steps", type=int, help="override the config's steps")
    parser.add_argument("--seed", dest="run_seed", type=int, help="override the config's seed")
    parser.add_argument("--run", help="read this run from the database instead of starting one")
    parser.add_argument("--engine", choices=("reference", "sglang", "both"),
                        help="measure generated tokens per second on this engine kind (both: "
                             "SGLang / reference, MET or MISSED) instead of the simulator's report")  # fmt: skip
    parser.add_argument("--checkpoint", type=Path,
                        help="with --engine: the model.init of every run (default: a tiny checkpoint "
                             "written by write_checkpoint)")  # fmt: skip
    parser.add_argument("--family", choices=engine_rate.FAMILIES, default=engine_rate.FAMILIES[0],
                        help="with --engine and no --checkpoint: the family of the tiny checkpoint "
                             "written (default qwen3.6: a live run's reference engine refuses qwen3)")  # fmt: skip
    live_costs.add_arguments(parser, "bench_live_run")
    args = parser.parse_args()
    if args.engine is not None:
        if args.run is not None or args.predict_from is not None:
            parser.error("--engine starts its own runs: --run and --predict-from do not apply")
        _compare_engines(args)
        return
    if args.checkpoint is not None:
        parser.error("--checkpoint needs --engine")
    other = live_costs.load_argument(parser, args).get("run")
    if args.predict_from and other is None:
        parser.error(f"{args.predict_from} holds no costs of bench_live_run (a policies benchmark's file?)")

    load_before = os.getloadavg()
    before: SimResult | None = None
    if args.run is None:
        config = parse_config(args.config.read_text()) if args.config else parse_config("")
        if args.steps:
            config = msgspec.structs.replace(config, steps=args.steps)
        if args.run_seed is not None:
            config = msgspec.structs.replace(config, seed=args.run_seed)
        # Made and printed before the run starts, so nothing of this run can go into it.
        before = _predict(other, config, args.sim_seed)

    env = {
        "GYRE_DATABASE_URL": os.environ.get("GYRE_DATABASE_URL") or fresh_database("gyre_bench_live"),
        "GYRE_REDIS_URL": os.environ.get("GYRE_REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
    print(f"database: {env['GYRE_DATABASE_URL']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gyre-bench-live-") as tmp:
        run_id = args.run
        if run_id is None:
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
            if args.run is not None:
                before = _predict(other, config, args.sim_seed)
            report = run_report(log, run_id, phi=config.phi, mu=config.mu)
            cells = cell_time(log, run_id)
            costs, predicted = predict_run(log, run_id, config.sched(), seed=args.sim_seed)
            mine = live_costs.measured(log, run_id, toml, costs.cluster)
    costs_file = live_costs.save(args.out, config.seed, {"run": mine})

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
    simulated = live_costs.simulated_s(predicted)
    print("\nthe simulator against the run (no target)")
    print(f"  this run's training: {costs.compute_s:.1f} s of passes over {costs.groups} groups "
          f"({cluster.train_node_hours_per_group * 3600:.2f} s/group, {cluster.microsteps_per_group} micro-steps/group); "
          f"update and publication {cluster.update_s:.2f} s")  # fmt: skip
    print(f"  real wall time                  {real:8.1f} s  (run.started -> last update)")
    print(f"  simulated, fed this run's costs {simulated:8.1f} s  (a fit: this run's own durations and "
          "training seconds go in, so the agreement is partly built in)")  # fmt: skip
    print(f"  real / simulated (same-run fit) {_ratio(real, simulated)}")
    if before is None or other is None:
        print("  predicted before the run               -  (no --predict-from)")
    else:
        ahead = live_costs.simulated_s(before)
        print(f"  predicted before the run        {ahead:8.1f} s  (from the costs of seed {other.seed} "
              f"alone, run {other.run_id})")  # fmt: skip
        print(f"  real / predicted before the run {_ratio(real, ahead)}")
    real_steps = [s.wall_s for s in report.steps if s.wall_s is not None]
    fit_steps = [h * 3600 for h in predicted.step_durations_h]
    ahead_steps = [h * 3600 for h in before.step_durations_h] if before else []
    for i, (r, s) in enumerate(zip(real_steps, fit_steps, strict=False)):
        ahead_step = f"  predicted {ahead_steps[i]:6.1f} s" if i < len(ahead_steps) else ""
        print(f"    step {i}: real {r:6.1f} s  same-run fit {s:6.1f} s{ahead_step}")
    print(f"  staleness: measured {report.staleness.measured_mean}, same-run fit {predicted.mean_staleness:.2f}"
          + (f", predicted {before.mean_staleness:.2f}" if before else "")
          + f", E[d] {report.staleness.expected_mean}")  # fmt: skip
    print(f"  load average (1, 5, 15 min): {_loads(load_before)} as the benchmark started, "
          f"{_loads(os.getloadavg())} at its end")  # fmt: skip
    print(f"  this run's costs: {costs_file} (--predict-from for a run on another seed)")


def _compare_engines(args: argparse.Namespace) -> None:
    """``--engine``: the same configuration and checkpoint on each engine kind asked for, one
    run after another, and their generated tokens per second."""
    kinds = ("reference", "sglang") if args.engine == "both" else (args.engine,)
    base = parse_config(args.config.read_text() if args.config else engine_rate.ENGINE_CONFIG)
    if args.steps:
        base = msgspec.structs.replace(base, steps=args.steps)
    if args.run_seed is not None:
        base = msgspec.structs.replace(base, seed=args.run_seed)
    print(f"target (fixed before measuring): SGLang >= {engine_rate.TARGET:.1f}x the reference engine's "
          "generated tokens per second over the rollout phase, same configuration and checkpoint",
          flush=True)  # fmt: skip
    env = {
        "GYRE_DATABASE_URL": os.environ.get("GYRE_DATABASE_URL") or fresh_database("gyre_bench_live"),
        "GYRE_REDIS_URL": os.environ.get("GYRE_REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
    print(f"database: {env['GYRE_DATABASE_URL']}", flush=True)
    rates: dict[str, engine_rate.GenerationRate] = {}
    loads: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {}
    # Kept (under --out, not committed): each run's folder holds its engines' logs.
    root = (Path(args.out) / f"engines-{int(time.time())}").resolve()
    root.mkdir(parents=True)
    print(f"runs' folders: {root}", flush=True)
    if args.checkpoint is not None:
        checkpoint = args.checkpoint.resolve()
    else:
        checkpoint = engine_rate.write_tiny_checkpoint(root / f"checkpoint-{args.family}", args.family)
    print(f"checkpoint (model.init of every run): {checkpoint}", flush=True)
    for kind in kinds:
        config = msgspec.structs.replace(
            base, engine=kind, model=msgspec.structs.replace(base.model, init=str(checkpoint))
        )
        folder = root / kind
        folder.mkdir()
        env["GYRE_DATA_DIR"] = str(folder / "data")
        print(f"\n{kind}: {config.steps} steps, {config.rollout_engines} engines x "
              f"{config.engine_capacity}, B={config.B} N={config.N}, max_tokens {config.model.max_tokens}, "
              f"seed {config.seed}", flush=True)  # fmt: skip
        began = os.getloadavg()
        run_id = _run(to_toml(config), env, folder)
        loads[kind] = (began, os.getloadavg())
        with PostgresEventLog(StoreConfig(env["GYRE_DATABASE_URL"])) as log:
            try:
                rates[kind] = engine_rate.generation_rate(log, run_id)
            except engine_rate.NoModelCalls as exc:
                raise SystemExit(str(exc)) from exc

    print("\ngenerated tokens per second (every recorded model call of the run)")
    print(f"  {'engine':<10} {'calls':>6} {'tokens':>7} {'phase s':>8} {'tok/s':>7}  "
          f"{'busy s':>7} {'tok/s':>7}  {'per-call decode tok/s':>21}  load (1 min) start -> end")  # fmt: skip
    for kind, r in rates.items():
        start, end = loads[kind]
        print(f"  {kind:<10} {r.calls:6d} {r.output_tokens:7d} {r.span_s:8.1f} {r.tokens_per_s:7.2f}  "
              f"{r.busy_s:7.1f} {r.busy_tokens_per_s:7.2f}  {r.mean_decode_rate:21.2f}  "
              f"{start[0]:.2f} -> {end[0]:.2f}")  # fmt: skip
    print(
        "  phase: first call's start -> last call's end (the target's window); busy: the time at "
        "least one call was open; per-call decode: mean of (tokens - 1) / (duration - first token)"
    )
    if len(rates) == 2:
        ref, sgl = rates["reference"], rates["sglang"]
        ratio = sgl.tokens_per_s / ref.tokens_per_s if ref.tokens_per_s > 0 else 0.0
        busy = sgl.busy_tokens_per_s / ref.busy_tokens_per_s if ref.busy_tokens_per_s > 0 else 0.0
        decode = sgl.mean_decode_rate / ref.mean_decode_rate if ref.mean_decode_rate > 0 else 0.0
        verdict = "MET" if ratio >= engine_rate.TARGET else "MISSED"
        print(f"\nSGLang / reference, tokens per second over the rollout phase: {ratio:.2f}x "
              f"(target >= {engine_rate.TARGET:.1f}x): {verdict}")  # fmt: skip
        print(f"  (no target) over busy time {busy:.2f}x; per-call decode rate {decode:.2f}x")


def _loads(loads: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in loads)


def _ratio(real: float, simulated: float) -> str:
    return f"{real / simulated:8.2f}" if simulated > 0 else "       - (simulated 0 s)"


if __name__ == "__main__":
    main()
