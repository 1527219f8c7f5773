"""The processes of a live run, one subcommand each: ``gyre node|launcher|evaluator|controller serve``.

Each reads its run's configuration from the log (``run.configured``), builds its component
from the packages and serves until SIGTERM. ``gyre run`` starts them; on a cluster, whatever
starts processes starts them with the same database and Redis URLs.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path

from gyre_proxy.launch import Launcher, LauncherConfig
from gyre_sched import Controller, LiveSink, TaskDeck
from gyre_store import (
    EventLog,
    PostgresEventLog,
    PostgresProjectionStore,
    RunConfigured,
    StreamId,
    TaskDefined,
    TaskSplit,
    evaluation_projections,
)
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, console, open_store
from gyre_tools.run_config import RunConfig, parse_config
from gyre_train import (
    AdmissionConfig,
    AdvantageConfig,
    EvaluatorWorker,
    GroupSourceConfig,
    PackingConfig,
    WorkerConfig,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, helptext, func in (
        ("node", "a node agent: this machine's rollout engines and trainer cells of a run", run_node),
        ("launcher", "start a run's executions as the scheduler asks", run_launcher),
        ("evaluator", "evaluate a run's finished executions and announce ready groups", run_evaluator),
        ("controller", "the run's scheduler: the decision core with a live command sink", run_controller),
    ):
        group = subparsers.add_parser(name, help=helptext)
        commands = group.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)
        serve = commands.add_parser("serve", help=helptext)
        add_store_arguments(serve)
        add_env_argument(serve, "--run", "GYRE_RUN_ID", help="the run id", required=True)
        if name == "launcher":
            add_env_argument(
                serve,
                "--proxy-url",
                "GYRE_PROXY_URL",
                default="http://127.0.0.1:8080",
                help="the run's proxy",
            )
        if name == "evaluator":
            add_env_argument(
                serve,
                "--threads",
                "GYRE_EVALUATOR_THREADS",
                default="2",
                type=int,
                help="evaluations at once",
            )
        if name == "node":
            add_env_argument(
                serve,
                "--dist-port",
                "GYRE_NODE_DIST_PORT",
                default="0",
                type=int,
                help="port of the trainer cells' torch.distributed rendezvous (0: a free one)",
            )
            add_env_argument(
                serve,
                "--engines",
                "GYRE_NODE_ENGINES",
                default="all",
                help="rollout engines here: all, none, or a count",
            )
            add_env_argument(
                serve,
                "--trainers",
                "GYRE_NODE_TRAINERS",
                default="all",
                help="trainer cells here: all or none",
            )
            add_env_argument(
                serve,
                "--engine-offset",
                "GYRE_NODE_ENGINE_OFFSET",
                default="0",
                type=int,
                help="number of this node's first engine",
            )
        serve.set_defaults(func=func)


def recorded_config(log: EventLog, run_id: str) -> RunConfig:
    """The configuration run ``run_id`` recorded; SystemExit when it has none."""
    for recorded in log.read_stream(StreamId("run", run_id)):
        if isinstance(recorded.event, RunConfigured):
            return parse_config(recorded.event.config_toml, where=f"run {run_id}'s recorded config")
    raise SystemExit(f"run {run_id!r} is not configured in this database (start it with `gyre run`)")


def train_tasks(log: EventLog, run_id: str) -> list[str]:
    """The run's training task ids, in the order they were defined."""
    return [
        r.event.task_id
        for r in log.read(0, types=["task.defined"], limit=1_000_000)
        if isinstance(r.event, TaskDefined) and r.event.run_id == run_id and r.event.split is TaskSplit.TRAIN
    ]


def _until_signal() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def run_launcher(args: argparse.Namespace) -> int:
    with open_store(args, upgrade=False) as opened:
        config = recorded_config(opened.log, args.run)
        root = Path(config.run_dir) / "workspaces"
        launcher = Launcher(
            opened.log,
            LauncherConfig(
                run_id=args.run,
                proxy_url=args.proxy_url,
                root=root,
                harness=config.harness,
                max_running=config.rollout_engines * config.engine_capacity,
            ),
        )
        console.print(f"launcher of run {args.run}: workspaces in {root}")
        launcher.run(_until_signal())
    return 0


def run_evaluator(args: argparse.Namespace) -> int:
    with open_store(args, upgrade=False) as opened:
        recorded_config(opened.log, args.run)
        store = PostgresProjectionStore(opened.log.pool, evaluation_projections().tables())
        worker = EvaluatorWorker(opened.log, store, WorkerConfig(run_id=args.run, threads=args.threads))
        console.print(f"evaluator of run {args.run}")
        worker.run(_until_signal())
    return 0


def run_controller(args: argparse.Namespace) -> int:
    with open_store(args, upgrade=False) as opened:
        config = recorded_config(opened.log, args.run)
        deck = TaskDeck(train_tasks(opened.log, args.run), config.seed)
        sink = LiveSink(opened.log, args.run, deck, group_size=config.N, harness=config.harness)
        controller = Controller(opened.log, config.sched(), sink, args.run)
        console.print(f"controller of run {args.run}: {config.policy}, phi={config.phi}, mu={config.mu}")
        controller.run(_until_signal(), poll_s=0.5)
    return 0


def run_node(args: argparse.Namespace) -> int:
    from gyre_tools.node_plan import node_plan  # torch and the training stack: only this process
    from gyre_train.cells import NodeAgent

    with open_store(args, upgrade=False, with_redis=True) as opened:
        assert isinstance(opened.log, PostgresEventLog)
        config = recorded_config(opened.log, args.run)
        plan = node_plan(
            opened.log,
            config,
            run_id=args.run,
            database_url=opened.services.database_url,
            redis_url=opened.services.redis_url,
            engines=args.engines,
            engine_offset=args.engine_offset,
            trainers=args.trainers,
            dist_port=args.dist_port,
        )
        stop = _until_signal()
        with NodeAgent(plan) as agent:
            console.print(f"node of run {args.run} (pid {os.getpid()}): {agent.pids()}")
            while not stop.is_set():
                agent.step()
                if agent.failed:
                    console.print(f"[red]trainer cells failed: {', '.join(agent.failed)}[/red]")
                    return 3
                stop.wait(0.2)
    return 0


def packing(config: RunConfig) -> PackingConfig:
    return PackingConfig(
        token_budget=config.train.micro_step_tokens, groups_per_batch=config.B, executions_per_group=config.N
    )


def group_source(config: RunConfig, run_id: str) -> GroupSourceConfig:
    return GroupSourceConfig(
        admission=AdmissionConfig(max_trajectories=config.train.jmax),
        advantages=AdvantageConfig(scale_by_std=config.train.scale_advantages),
        seed=config.seed,
        trainer="core",
        run_id=run_id,
    )
