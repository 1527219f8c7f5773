"""The processes of a live run, one subcommand each: ``gyre node|launcher|evaluator|controller serve``.

Each reads its run's configuration from the log (``run.configured``), builds its component
from the packages and serves until SIGTERM. ``gyre run`` starts them; on a cluster, whatever
starts processes starts them with the same database and Redis URLs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from gyre_proxy.harness import BuiltinHarness, HarnessPlugin, plugin_for
from gyre_proxy.launch import Launcher, LauncherConfig, RedisLiveness
from gyre_sched import Controller, LiveSink, RegisteredPool, TaskDeck
from gyre_sched.live import MetricsServer
from gyre_store import (
    EventLog,
    FaultPoint,
    PostgresEventLog,
    PostgresProjectionStore,
    RecordedEvent,
    RunConfigured,
    StoreUnavailable,
    StreamId,
    TaskDefined,
    TaskSplit,
    evaluation_projections,
    until_signal,
)
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, console, open_store
from gyre_tools.placement import SandboxPlacement
from gyre_tools.proxy import registered_proxy
from gyre_tools.restarts import GAVE_UP, RestartPolicy
from gyre_tools.run_config import (
    CORE_CELL,
    ConfigFileError,
    RunConfig,
    judge_engine,
    parse_config,
    trainer_cells,
)
from gyre_tools.work_claims import RedisEvaluationClaims
from gyre_train import (
    AdmissionConfig,
    AdvantageConfig,
    EngineJudgeClient,
    Evaluator,
    EvaluatorWorker,
    GroupSourceConfig,
    JudgeEvaluator,
    OpenAIChatClient,
    PackingConfig,
    WorkerConfig,
    context_budget_chars,
    judge_slot,
)
from gyre_train.sandbox import sandbox_for
from gyre_train.tasks import SandboxTestEvaluator, TaskFiles, event_task

if TYPE_CHECKING:
    from gyre_train.cells import NodeAgent, NodePlan


PROXY_WAIT_S = 120.0  # how long a launcher not told the proxy's URL waits for its registration


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
                help="the run's proxy (default: the URL the run's proxy registered in the log, "
                f"waited for up to {PROXY_WAIT_S:.0f} s)",
            )
            add_env_argument(
                serve,
                "--name",
                "GYRE_LAUNCHER_NAME",
                default=socket.gethostname(),
                help="this launcher among the run's (one per host), recorded with each execution it "
                "starts; a launcher started again under the same name finishes the ones it lost",
            )
            add_env_argument(
                serve,
                "--max-running",
                "GYRE_LAUNCHER_MAX_RUNNING",
                type=int,
                help="harnesses this launcher runs at once (default: the run's rollout capacity, "
                "rollout_engines x engine_capacity; with a launcher per host, each host's share)",
            )
        if name == "controller":
            add_env_argument(
                serve,
                "--metrics-port",
                "GYRE_CONTROLLER_METRICS_PORT",
                type=int,
                help="serve the controller's Prometheus metrics at /metrics on this port (0: a free one; "
                "default: none)",
            )
            add_env_argument(
                serve,
                "--metrics-host",
                "GYRE_CONTROLLER_METRICS_HOST",
                default="127.0.0.1",
                help="the address the metrics port listens on",
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
                "--cell-metrics-port",
                "GYRE_NODE_CELL_METRICS_PORT",
                type=int,
                help="serve each trainer cell's Prometheus metrics at /metrics on this port plus the "
                "cell's number (0: free ports, printed by each cell); default: not served",
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
                help="trainer cells here: all, none, or cell numbers (0 is the core; e.g. 0, 1-3, 1,2); "
                "a node without the core joins the world of cells the core's node recorded in the log",
            )
            add_env_argument(
                serve,
                "--host",
                "GYRE_NODE_HOST",
                default="127.0.0.1",
                help="the address this node's engines listen on (0.0.0.0: every address)",
            )
            add_env_argument(
                serve,
                "--advertise-host",
                "GYRE_NODE_ADVERTISE_HOST",
                help="the address other machines reach this node's engines at, in the URL each "
                "registers (default: --host; needed with a wildcard --host)",
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


def _configured(log: EventLog, run_id: str) -> RecordedEvent:
    """Run ``run_id``'s ``run.configured`` event; SystemExit when it has none."""
    for recorded in log.read_stream(StreamId("run", run_id)):
        if isinstance(recorded.event, RunConfigured):
            return recorded
    raise SystemExit(f"run {run_id!r} is not configured in this database (start it with `gyre run`)")


def recorded_config(log: EventLog, run_id: str) -> RunConfig:
    """The configuration run ``run_id`` recorded; SystemExit when it has none."""
    event = _configured(log, run_id).event
    assert isinstance(event, RunConfigured)
    return parse_config(event.config_toml, where=f"run {run_id}'s recorded config")


def run_incarnation(log: EventLog, run_id: str) -> str:
    """What tells run ``run_id`` of this database from another run of the same id (another
    database, an earlier test): its ``run.configured`` event's id, the same in every life of
    the run. Keys a run keeps outside the log (Redis) carry it."""
    return _configured(log, run_id).event_id.hex[:12]


def train_tasks(log: EventLog, run_id: str) -> list[str]:
    """The run's training task ids, in the order they were defined."""
    return [
        r.event.task_id
        for r in log.read(0, types=["task.defined"], limit=1_000_000)
        if isinstance(r.event, TaskDefined) and r.event.run_id == run_id and r.event.split is TaskSplit.TRAIN
    ]


def harness_plugin(name: str, *, max_tokens: int) -> HarnessPlugin:
    """The run's harness plug-in; the built-in agent asks for ``max_tokens`` per call (other
    harnesses ask for what they ask, and the proxy caps it at the same ``model.max_tokens``)."""
    plugin = plugin_for(name)
    if isinstance(plugin, BuiltinHarness):
        plugin.max_tokens = max_tokens
    return plugin


def proxy_url(log: EventLog, run_id: str, given: str | None, wait_s: float = PROXY_WAIT_S) -> str:
    """``given``, or else the URL run ``run_id``'s proxy registered, waited for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while not (url := given or registered_proxy(log, run_id)):
        if time.monotonic() > deadline:
            raise SystemExit(
                f"gyre launcher serve: run {run_id}'s proxy registered no URL within {wait_s:.0f} s; "
                "start `gyre proxy serve --run` or give --proxy-url"
            )
        time.sleep(0.5)
    return url


def run_launcher(args: argparse.Namespace) -> int:
    with open_store(args, upgrade=False, with_redis=True) as opened:
        config = recorded_config(opened.log, args.run)
        proxy = proxy_url(opened.log, args.run, args.proxy_url)
        root = Path(config.run_dir) / "workspaces"
        placement = SandboxPlacement(
            config.sandbox.kind,
            proxy_url=proxy,
            relay_dir=Path(config.run_dir) / "relay",
            disk_mb=config.sandbox.disk_mb or None,
        )
        launcher = Launcher(
            opened.log,
            LauncherConfig(
                run_id=args.run,
                proxy_url=proxy,
                root=root,
                harness=config.harness,
                max_running=args.max_running or config.rollout_engines * config.engine_capacity,
                name=args.name,
                max_booting=config.sandbox.boot_concurrency if config.sandbox.kind != "local" else 0,
                boot_retries=config.sandbox.boot_retries,
            ),
            plugin=harness_plugin(config.harness, max_tokens=config.model.max_tokens),
            placement=placement,
            liveness=(liveness := RedisLiveness(opened.services.redis_url, args.run, args.name)),
        )
        console.print(
            f"launcher {args.name} of run {args.run}: workspaces in {root}, sandbox {config.sandbox.kind}"
        )
        try:
            launcher.run(until_signal())
        finally:
            placement.close()
            liveness.close()
    return 0


def run_evaluator(args: argparse.Namespace) -> int:
    with open_store(args, upgrade=False, with_redis=True) as opened:
        config = recorded_config(opened.log, args.run)
        store = PostgresProjectionStore(opened.log.pool, evaluation_projections().tables())
        evaluator_for, judge = sourced_evaluators(config, opened.log)
        # The run's workers, on every machine, share its evaluations through claims in Redis.
        claims = RedisEvaluationClaims(  # keys of this run alone, not of an earlier one of its id
            opened.services.redis_url,
            f"{args.run}:{run_incarnation(opened.log, args.run)}",
            f"{socket.gethostname()}:{os.getpid()}",
        )
        worker = EvaluatorWorker(
            opened.log,
            store,
            WorkerConfig(run_id=args.run, threads=args.threads),
            evaluator_for=evaluator_for,
            claims=claims,
        )
        judged = f"; tasks with a rubric judged by {config.eval.judge}" if judge else ""
        console.print(f"evaluator of run {args.run}: tasks' tests in {config.sandbox.kind}{judged}")
        try:
            worker.run(until_signal())
        finally:
            claims.close()
            if judge is not None:
                judge.close()
    return 0


def sourced_evaluators(
    config: RunConfig, log: EventLog, *, environ: Mapping[str, str] | None = None
) -> tuple[Callable[[TaskDefined], Evaluator | None], OpenAIChatClient | EngineJudgeClient | None]:
    """The evaluator of each task read from a source: with ``[eval] judge`` set, a task that
    has a rubric is scored by the judge (its tests are not run); every other task by its own
    tests in the run's sandbox kind. A built-in family's task: its tests in the run's sandbox
    kind too, but under ``local`` None (the worker's command evaluator runs them). Returns the factory and the judge's client (to close), if
    any. A URL judge's key is read from the environment variable ``[eval] judge_key_env``; a
    judge on the run's engines (``policy``, ``engine:NAME``) calls through the proxy the run
    registered, showing as much of a workspace as fits ``model.max_context``."""
    tests = sandbox_for(config.sandbox.kind)
    files = TaskFiles()
    judge: OpenAIChatClient | EngineJudgeClient | None = None
    setting = config.eval.judge
    if setting == "policy" or setting.startswith("engine:"):

        def engine_name(name: str) -> str:
            found = judge_engine(config, name)
            if found is None:  # refused by the config's check too
                raise ConfigFileError(f"eval.judge = {setting!r}: the run has no engine {name!r}")
            return found

        judge = EngineJudgeClient(
            log,
            config.run_id,
            slot=judge_slot(setting, engine_name),
            proxy_url=lambda: registered_proxy(log, config.run_id),
            max_tokens=config.model.max_tokens,
        )
    elif setting:
        env = os.environ if environ is None else environ
        key = env.get(config.eval.judge_key_env, "") if config.eval.judge_key_env else ""
        judge = OpenAIChatClient(setting, key, config.eval.judge_model)

    def evaluator_for(event: TaskDefined) -> Evaluator | None:
        if not event.source:  # a built-in family's: its files are in the event
            if config.sandbox.kind == "local":
                return None  # the worker's command evaluator, on this host, as before
            return SandboxTestEvaluator(event_task(event), tests)
        task = files.task(event)
        if judge is None or not task.rubric:
            return SandboxTestEvaluator(task, tests)
        judged = functools.partial(
            JudgeEvaluator, judge, log, judge=setting, prompt=task.prompt, rubric=task.rubric, task_id=task.id
        )
        if isinstance(judge, OpenAIChatClient):
            return judged()
        model = config.model
        return judged(
            budget_chars=context_budget_chars(model.max_context, model.max_tokens, task.prompt, task.rubric)
        )

    return evaluator_for, judge


def run_controller(args: argparse.Namespace) -> int:
    with open_store(args, upgrade=False) as opened:
        config = recorded_config(opened.log, args.run)
        deck = TaskDeck(train_tasks(opened.log, args.run), config.seed)
        sink = LiveSink(opened.log, args.run, deck, group_size=config.N, harness=config.harness)
        # C_s follows the pool engines that registered and answer, on every machine.
        pool = RegisteredPool(opened.log, args.run, engine_answers).start()
        try:
            controller = Controller(
                opened.log, config.sched(), sink, args.run, fault=FaultPoint.from_env(), pool_capacity=pool
            )
            console.print(f"controller of run {args.run}: {config.policy}, phi={config.phi}, mu={config.mu}")
            with contextlib.ExitStack() as metrics:
                if args.metrics_port is not None:
                    server = metrics.enter_context(
                        MetricsServer(controller, host=args.metrics_host, port=args.metrics_port)
                    )
                    console.print(f"controller metrics at {server.url}")
                controller.run(until_signal(), poll_s=0.5)
        finally:
            pool.close()
    return 0


def engine_answers(url: str, timeout_s: float = 3.0) -> bool:
    """Whether the engine at ``url`` answers its ``/health`` (SGLang's API) within ``timeout_s``."""
    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def run_node(args: argparse.Namespace) -> int:
    # torch and the training stack: only this process
    from gyre_tools.node_plan import newest_world, node_plan
    from gyre_train.cells import NodeAgent

    with open_store(args, upgrade=False, with_redis=True) as opened:
        assert isinstance(opened.log, PostgresEventLog)
        config = recorded_config(opened.log, args.run)

        def plan(engines: str, trainers: str) -> NodePlan:
            return node_plan(
                opened.log,
                config,
                run_id=args.run,
                database_url=opened.services.database_url,
                redis_url=opened.services.redis_url,
                engines=engines,
                engine_offset=args.engine_offset,
                trainers=trainers,
                dist_port=args.dist_port,
                host=args.host,
                advertise_host=args.advertise_host,
                cell_metrics_port=args.cell_metrics_port,
            )

        stop = until_signal()
        pid_file = Path(config.run_dir) / "logs" / f"node-{args.engine_offset}-pids.json"
        # Engines and trainer cells are supervised apart: a trainer world that must start again
        # (its core died) never takes the engines, and their executions, down with it.
        with NodeAgent(plan(args.engines, "none")) as engines:
            here = trainer_cells(args.trainers, config.cells)
            follow = None
            if here and CORE_CELL not in here:  # satellites only: they join the world the core's node records

                def follow() -> str | None:
                    world = newest_world(opened.log, args.run)
                    return world.world if world is not None else None

            trainers = Trainers(
                lambda: NodeAgent(plan("none", args.trainers)), any_cell=config.cells_move, follow=follow
            )
            try:
                console.print(
                    f"node of run {args.run} (pid {os.getpid()}): {engines.pids() | trainers.pids()}"
                )
                written: dict[str, int | None] = {}
                while not stop.is_set():
                    engines.step()
                    note = trainers.step()
                    if note:
                        console.print(note)
                    pids = engines.pids() | trainers.pids()
                    if pids != written:  # for operators (and fault tests): which process is which
                        written = pids
                        pid_file.parent.mkdir(parents=True, exist_ok=True)
                        pid_file.write_text(json.dumps(written))
                    if trainers.gave_up:
                        console.print(f"[red]trainer cells keep failing: {trainers.gave_up}[/red]")
                        return GAVE_UP
                    stop.wait(0.2)
            finally:
                trainers.close()
    return 0


@dataclass
class Trainers:
    """This node's trainer cells, started again as a whole when the core dies (the world of a
    torch.distributed group takes no restarted member). A satellite that dies is left dead:
    the core takes its claims over and trains on without it. Elastic cells (``any_cell``) are
    started again as a whole when any of them dies: a dead elastic cell would leave its
    transition, and its engine's capacity, unfinished; each cell of the new world takes up its
    role from its steps in the log. The new world resumes after
    the run's last publication (``resume_point``). More than ``MAX_RESTARTS`` deaths in a row,
    each soon after the world started (``RestartPolicy``), give up: a failure every start
    repeats ends the node agent (exit 3), and with it the run, instead of looping.

    A node that runs satellites but not the core (``follow``: the newest world the core's node
    recorded) starts its cells in that world, and again in each newer one the core's node
    starts: its satellites that died with the old world wait for the new one."""

    make: Callable[[], NodeAgent]
    any_cell: bool = False  # elastic cells: any cell's death starts the world again
    follow: Callable[[], str | None] | None = None
    followed_at: float = 0.0
    agent: NodeAgent | None = None
    policy: RestartPolicy = field(default_factory=lambda: RestartPolicy(max_in_a_row=Trainers.MAX_RESTARTS))
    started_at: float = field(default_factory=time.monotonic)
    down_since: float | None = None
    pause_s: float = 0.0
    noted: set[str] = field(default_factory=set)
    gave_up: str = ""

    MAX_RESTARTS = 5

    def __post_init__(self) -> None:
        self.agent = self.make().__enter__()
        self.started_at = time.monotonic()

    def pids(self) -> dict[str, int | None]:
        return self.agent.pids() if self.agent is not None else {}

    def step(self) -> str:
        """Note dead cells; start the world again (after a pause) once its core died."""
        if self.follow is not None:
            return self._follow()
        agent, note = self.agent, self._note_dead()
        if agent is not None:
            core_failed = any(f.startswith("cell-0 ") for f in agent.failed)  # cell 0 is the core
            if not (core_failed or (self.any_cell and agent.failed)):
                return note
            agent.__exit__(None, None, None)
            self.agent, self.down_since = None, time.monotonic()
            pause = self.policy.died(lived_s=self.down_since - self.started_at)
            if pause is None:
                self.gave_up = f"{self.policy.in_a_row} deaths in a row, each soon after the cells started"
                return note
            self.pause_s = pause
        if self.gave_up:
            return note
        now = time.monotonic()
        assert self.down_since is not None
        if now - self.down_since < self.pause_s:
            return note
        self.noted.clear()
        try:
            self.agent = self.make().__enter__()  # reads the resume point from the log
        except StoreUnavailable as exc:
            self.down_since = now  # the next try after the same pause
            return f"trainer cells not started again yet: {exc}"
        self.started_at = time.monotonic()
        started = "trainer cells started again, resuming after the last publication"
        return f"{note}; {started}" if note else started

    def _note_dead(self) -> str:
        """Step the agent (if any); a note of the cells that died since the last note."""
        if self.agent is None:
            return ""
        self.agent.step()
        new = [f for f in self.agent.failed if f not in self.noted]
        self.noted.update(new)
        return f"trainer cells died: {', '.join(new)}" if new else ""

    def _follow(self, every_s: float = 1.0) -> str:
        """Satellites only: note dead cells; start the cells in the core's newest world."""
        note = self._note_dead()
        now = time.monotonic()
        if now - self.followed_at < every_s:
            return note
        self.followed_at = now
        assert self.follow is not None
        try:
            newest = self.follow()
            plan = self.agent.plan.trainers if self.agent is not None else None
            if self.agent is not None and newest == (plan.world if plan is not None else None):
                return note
            if self.agent is not None:
                self.agent.__exit__(None, None, None)
                self.agent = None
            self.noted.clear()
            self.agent = self.make().__enter__()
        except StoreUnavailable as exc:
            return "; ".join(filter(None, [note, f"the core's world not looked up yet: {exc}"]))
        self.started_at = time.monotonic()
        if newest is None:
            return note
        return "; ".join(filter(None, [note, f"satellites started in the core's world {newest}"]))

    def close(self) -> None:
        if self.agent is not None:
            self.agent.__exit__(None, None, None)
            self.agent = None


def packing(config: RunConfig) -> PackingConfig:
    return PackingConfig(
        token_budget=config.train.micro_step_tokens,
        groups_per_batch=config.B,
        executions_per_group=config.N,
        skip_zero_advantage=config.train.skip_zero_advantage,
    )


def group_source(config: RunConfig, run_id: str) -> GroupSourceConfig:
    return GroupSourceConfig(
        admission=AdmissionConfig(max_trajectories=config.train.jmax),
        advantages=AdvantageConfig(scale_by_std=config.train.scale_advantages),
        seed=config.seed,
        trainer="core",
        run_id=run_id,
    )
