"""A live run's measured costs kept in a file, and the simulator's prediction made from them.

The live benchmarks compare a run's wall time with the simulator's. Fed that same run's
measured costs (``gyre_sched.predict_run``), the simulator agrees with the run partly by
construction: the run's own execution durations and training seconds go in. So each benchmark
also writes the costs it measured to a file (a ``RunCosts`` per policy, under
``out/<benchmark>/``, not committed), and given an earlier run's file from another seed
(``--predict-from``) predicts the run before it starts, from those costs alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from gyre_sched import ClusterConfig, EmpiricalWorkload, SimResult, simulate, workload_from_run
from gyre_store.log import EventLog
from gyre_tools.run_config import RunConfig, parse_config

ROOT = Path(__file__).resolve().parent.parent


class CostsFileError(Exception):
    """A costs file cannot be read, or cannot predict this run like for like."""


class RunCosts(msgspec.Struct, frozen=True, kw_only=True):
    """What one run measured: the simulator's cluster costs and its executions' durations."""

    run_id: str
    seed: int
    config_toml: str  # the run's configuration as its log records it
    cluster: ClusterConfig  # training, update and transition seconds (gyre_sched.measured_cluster)
    workload: EmpiricalWorkload  # its finished executions' durations, by group


def measured(log: EventLog, run_id: str, config_toml: str, cluster: ClusterConfig) -> RunCosts:
    """The costs of ``run_id`` to keep: ``cluster`` (as ``predict_run`` measured it) and the
    run's execution durations read from ``log``."""
    seed = parse_config(config_toml).seed
    return RunCosts(
        run_id=run_id,
        seed=seed,
        config_toml=config_toml,
        cluster=cluster,
        workload=workload_from_run(log, run_id),
    )


def add_arguments(parser: argparse.ArgumentParser, benchmark: str) -> None:
    """The live benchmarks' common options: the simulator's seed, ``--predict-from`` and
    ``--out`` (default ``out/<benchmark>``)."""
    parser.add_argument("--sim-seed", type=int, default=0, help="the simulator's seed")
    parser.add_argument(
        "--predict-from",
        type=Path,
        help="a costs file an earlier run of this benchmark wrote (another seed, the same "
        "configuration): predict this run from it before it starts",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "out" / benchmark, help="folder for this run's costs file"
    )


def load_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, RunCosts]:
    """The costs ``--predict-from`` names (empty without it); a bad file is a usage error."""
    if args.predict_from is None:
        return {}
    try:
        return load(args.predict_from)
    except CostsFileError as exc:
        parser.error(str(exc))


def save(folder: Path, seed: int, costs: dict[str, RunCosts]) -> Path:
    """Write ``costs`` (by policy) as JSON to ``folder``/costs-seed<seed>.json; return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"costs-seed{seed}.json"
    path.write_bytes(msgspec.json.format(msgspec.json.encode(costs)))
    return path


def load(path: Path) -> dict[str, RunCosts]:
    """The costs by policy in ``path``; raises CostsFileError when it is missing or not one."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=dict[str, RunCosts])
    except OSError as exc:
        raise CostsFileError(f"cannot read the costs file {path}: {exc}") from exc
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise CostsFileError(f"{path} is not a costs file written by a live benchmark: {exc}") from exc


def check_like_for_like(costs: RunCosts, config: RunConfig) -> None:
    """Raise CostsFileError unless ``costs`` come from another seed of ``config``'s
    configuration: everything the same but the seed, the step count and what ``gyre run``
    fills in as it starts (the run's id and folder, and the starting policy's folder, which
    the recorded config names where ``config`` may still say ``warm-start``)."""
    if costs.seed == config.seed:
        raise CostsFileError(
            f"the costs of run {costs.run_id} were measured on seed {costs.seed}, this run's seed: "
            "a prediction before the run needs costs from another seed"
        )
    recorded = parse_config(costs.config_toml)
    other = msgspec.structs.replace(
        recorded,
        seed=config.seed,
        steps=config.steps,
        run_id=config.run_id,
        run_dir=config.run_dir,
        model=msgspec.structs.replace(recorded.model, init=config.model.init),
    )
    if other != config:
        differ = [
            f"{f}: {getattr(other, f)!r} there, {getattr(config, f)!r} here"
            for f in config.__struct_fields__
            if getattr(other, f) != getattr(config, f)
        ]
        raise CostsFileError(
            f"the costs of run {costs.run_id} come from another configuration ({'; '.join(differ)})"
        )


def predict(costs: RunCosts, config: RunConfig, *, sim_seed: int) -> SimResult:
    """The simulator's run of ``config`` (its scheduler and step count) on ``costs`` measured
    by another run; raises CostsFileError when they are not like for like."""
    check_like_for_like(costs, config)
    return simulate(
        config.sched(),
        costs.cluster,
        costs.workload,
        steps=config.steps,
        seed=sim_seed,
        name=f"predicted from {costs.run_id}",
    ).result


def simulated_s(result: SimResult) -> float:
    """A simulated run's wall seconds, first dispatch to the last update."""
    return result.step_end_s[-1] if result.step_end_s else result.total_h * 3600
