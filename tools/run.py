"""``gyre run`` and ``gyre demo``: a live RL run on real processes, from one config file.

Reads top to bottom: open the store (embedded servers when none is configured), resolve the
run (a new one, or the one whose id is given, continued), make sure the starting policy
exists, record the configuration and the tasks, start the run's processes (a node agent with
the rollout engines and trainer cells, the proxy, the launcher, an evaluator worker, the
controller), evaluate the held-out tasks, record ``run.started`` (the controller then
dispatches), follow the run until its last publication, evaluate the held-out tasks again,
stop the processes, and write the report (JSON, plots, TensorBoard) from the log alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from rich.live import Live
from rich.table import Table

from gyre_proxy.engines import EngineClient, EngineClientConfig, EngineError, free_port
from gyre_sched import register_sched_events
from gyre_store import (
    EngineRegistered,
    EventLog,
    EventMetadata,
    ExecutionDispatched,
    ExecutionStartRequested,
    NewEvent,
    RunConfigured,
    RunStarted,
    StoreUnavailable,
    StreamId,
    TaskDefined,
    TaskSplit,
    WeightsPublished,
    cell_time,
    read_to_head,
    run_report,
)
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, console, open_store
from gyre_tools.restarts import GAVE_UP, RestartPolicy
from gyre_tools.run_config import (
    DEMO,
    ExternalEngine,
    RunConfig,
    check_environment,
    parse_config,
    read_config,
    to_toml,
)
from gyre_tools.run_outputs import cell_time_summary, publications_from_log, write_outputs
from gyre_tools.run_steps import StepFollower, TensorBoardSteps, WandbSteps, metric_sinks, step_line
from gyre_tools.warmstart import ensure_policy
from gyre_train import GyreTrainError
from gyre_train.tasks import defined_tasks


def register(subparsers: Any) -> None:
    run = subparsers.add_parser("run", help="a live RL run from a config file")
    demo = subparsers.add_parser("demo", help="a short live run on the embedded PostgreSQL and Redis")
    for parser in (run, demo):
        add_store_arguments(parser)
        parser.add_argument("--json", type=Path, help="write the run's figures here as JSON")
        add_env_argument(
            parser,
            "--metrics",
            "GYRE_RUN_METRICS",
            default="tensorboard",
            help="where each step's scalars go as it lands: tensorboard, wandb (online when W&B is "
            "configured, else offline), both (tensorboard,wandb) or none",
        )
        parser.add_argument("--quiet", action="store_true", help="no live view")
    add_env_argument(run, "--config", "GYRE_RUN_CONFIG", help="the run's TOML file (see --write-config)")
    add_env_argument(run, "--run-id", "GYRE_RUN_ID", help="continue this run (default: the config's run_id)")
    add_env_argument(
        run, "--policy", "GYRE_RUN_POLICY", help="async, elastic or colocate (default: the config's policy)"
    )
    run.add_argument("--write-config", type=Path, help="write the demo's commented config here and exit")
    run.set_defaults(func=run_command)
    demo.set_defaults(func=demo_command)


def demo_command(args: argparse.Namespace) -> int:
    args.config, args.write_config, args.run_id = None, None, None
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    if getattr(args, "write_config", None):
        args.write_config.write_text(to_toml(DEMO))
        console.print(f"wrote the demo's configuration to {args.write_config}")
        return 0
    policy = getattr(args, "policy", None) or None
    if args.config:
        config = read_config(Path(args.config), policy=policy)
    else:
        config = parse_config(to_toml(DEMO), where="the demo's config", policy=policy) if policy else DEMO
    try:
        sinks = metric_sinks(args.metrics)
    except ValueError as exc:
        console.print(f"[red]gyre run: {exc}[/red]")
        return 2
    check_environment(config)  # e.g. SGLang's environment, before anything starts
    started = time.monotonic()
    register_sched_events()
    # SIGTERM ends the run as Ctrl-C does: the processes are stopped and the report written.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with open_store(args, with_redis=True) as opened, contextlib.ExitStack() as sinks_open:
        run = LiveRun(opened.log, config, Path(args.data_dir), args.run_id or config.run_id or None)
        run.phases["store"] = time.monotonic() - started  # embedded servers started (or connected)
        env = {
            **os.environ,
            "GYRE_DATABASE_URL": opened.services.database_url,
            "GYRE_REDIS_URL": opened.services.redis_url,
            "GYRE_DATA_DIR": str(args.data_dir),
        }
        with run.phase("prepare"):  # the run and its starting policy (a warm start once)
            run.prepare()
        if policy and run.config.policy != policy:
            console.print(
                f"[red]run {run.run_id} was recorded with policy {run.config.policy!r}, not "
                f"{policy!r}: a continued run keeps its recorded configuration[/red]"
            )
            return 2
        if "wandb" in sinks:  # open before the processes start: a W&B that cannot start stops nothing
            run.wandb = sinks_open.enter_context(
                WandbSteps(Path(run.config.run_dir), run.run_id, msgspec.to_builtins(run.config))
            )
        try:
            with run.phase("start"):
                run.start(env)
            run.follow(live_view=not args.quiet, sinks=sinks)
        except RunFailed as exc:
            run.failed = str(exc)
        finally:
            with run.phase("stop"):
                run.stop()
        with run.phase("report"):
            report = run_report(opened.log, run.run_id, phi=run.config.phi, mu=run.config.mu)
            summary = write_outputs(
                report,
                run.config,
                Path(run.config.run_dir),
                tensorboard="tensorboard" in sinks,
                written=frozenset(run.written_steps),
            )
            if run.wandb is not None:
                for step in report.steps:  # any step the run did not log as it landed
                    run.wandb.write(step)
                ev = summary["eval"]
                run.wandb.summarize(
                    {
                        "eval/pass_rate_before": ev["pass_rate_before"],
                        "eval/pass_rate_after": ev["pass_rate_after"],
                        "reward/gain": summary["reward"]["gain"],
                    }
                )
                summary["wandb"] = {"mode": run.wandb.mode, "dir": str(Path(run.config.run_dir) / "wandb")}
            summary["cell_time"] = cell_time_summary(cell_time(opened.log, run.run_id))
            summary["publications"] = publications_from_log(opened.log, run.run_id)
        summary["phases_s"] = {name: round(seconds, 1) for name, seconds in run.phases.items()}
        summary["wall_s"] = round(time.monotonic() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    console.print(run.verdict(summary))
    console.print("seconds by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in summary["phases_s"].items()))
    return 0 if run.failed is None else 3


@dataclass
class LiveRun:
    log: EventLog
    requested: RunConfig
    data_dir: Path
    run_id_arg: str | None
    run_id: str = ""
    config: RunConfig = field(default_factory=RunConfig)
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    failed: str | None = None
    proxy_url: str = ""
    commands: dict[str, list[str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    max_restarts: int = 5  # deaths in a row (each soon after its start) that end the run
    _policies: dict[str, RestartPolicy] = field(default_factory=dict)
    _spawned: dict[str, float] = field(default_factory=dict)
    _due: dict[str, float] = field(default_factory=dict)
    _lifecycle: Lifecycle = field(default_factory=lambda: Lifecycle(""))
    phases: dict[str, float] = field(default_factory=dict)  # seconds each phase of gyre run took
    written_steps: set[int] = field(default_factory=set)  # steps whose TensorBoard scalars follow() wrote
    wandb: WandbSteps | None = None  # with --metrics wandb: the W&B run each step is logged to

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - began

    # -- the run and its configuration -----------------------------------------------------------

    def prepare(self) -> None:
        """Resolve the run: a recorded one continues with its recorded config; a new one gets
        its starting policy, its folder, its recorded config and its tasks."""
        self.run_id = self.run_id_arg or f"run-{uuid.uuid4().hex[:8]}"
        self._lifecycle = Lifecycle(self.run_id)
        recorded = self._recorded()
        if recorded is not None:
            self.config = recorded
            console.print(f"continuing run [bold]{self.run_id}[/bold] with its recorded configuration")
            return
        run_dir = Path(self.requested.run_dir or self.data_dir / "runs" / self.run_id).resolve()
        policy = ensure_policy(self.requested, self.data_dir)
        resolved = parse_config(
            to_toml(_replace(self.requested, run_id=self.run_id, run_dir=str(run_dir), init=str(policy)))
        )
        self.config = resolved
        meta = EventMetadata(run_id=self.run_id)
        events = [
            NewEvent(
                RunConfigured(run_id=self.run_id, config_toml=to_toml(resolved)),
                f"configured:{self.run_id}",
                metadata=meta,
            )
        ]
        try:
            tasks = defined_tasks(
                resolved.tasks.spec,
                self.run_id,
                train=resolved.tasks.train,
                heldout=resolved.tasks.heldout,
                seed=resolved.seed,
                budget_s=resolved.tasks.budget_s,
                heldout_ids=resolved.tasks.heldout_ids,
            )
        except GyreTrainError as exc:
            raise SystemExit(f"tasks.source: {exc}") from None
        for task in tasks:
            events.append(NewEvent(task, f"task:{self.run_id}/{task.task_id}", metadata=meta))
        self.log.append(events)
        console.print(f"run [bold]{self.run_id}[/bold]: {len(events) - 1} tasks, folder {run_dir}")

    def _recorded(self) -> RunConfig | None:
        for recorded in self.log.read_stream(StreamId("run", self.run_id)):
            if isinstance(recorded.event, RunConfigured):
                return parse_config(recorded.event.config_toml, where=f"run {self.run_id}")
        return None

    # -- processes ---------------------------------------------------------------------------------

    def start(self, env: dict[str, str]) -> None:
        logs = Path(self.config.run_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.proxy_url = f"http://127.0.0.1:{port}"
        gyre = [sys.executable, "-m", "gyre_tools.cli"]
        run = ["--run", self.run_id]
        commands = {
            **self._nodes(gyre, run),
            # Every life of the proxy spools to the run's folder, so the next one sends what a
            # killed one left; the answers log is what the store's records are held against.
            "proxy": [*gyre, "proxy", "serve", *run, "--port", str(port), "--harness", self.config.harness,
                      "--context-limit", str(self.config.model.max_context),
                      "--max-tokens", str(self.config.model.max_tokens),
                      "--spool-dir", str(Path(self.config.run_dir) / "proxy-spool"),
                      "--answers-log", str(logs / "proxy-answers.jsonl"), *self._proxy_model()],
            "launcher": [*gyre, "launcher", "serve", *run, "--proxy-url", self.proxy_url],
            "evaluator": [*gyre, "evaluator", "serve", *run],
            "controller": [*gyre, "controller", "serve", *run],
        }  # fmt: skip
        self.commands, self.env = commands, env
        # Engines register anew in each life of the run; until they have, nothing may start
        # an execution (on a continuing run the log still names the dead engines' addresses).
        since = self.log.head()
        for name in commands:
            if name not in ("launcher", "evaluator", "controller"):
                self._spawn(name)
        self._register_external_engines()
        # An SGLang server takes tens of seconds to start on a loaded CPU (its own processes,
        # torch's import, the model's load): the reference engine's 180 s are not enough.
        self._wait_for_engines(timeout_s=180.0 if self.config.engine == "reference" else 900.0, after=since)
        for name in ("launcher", "evaluator", "controller"):
            self._spawn(name)

    def _proxy_model(self) -> list[str]:
        """``--model DIR`` for the proxy when the policy's folder holds a tokenizer (a
        checkpoint of its own: its tokenizer and chat template render every request); none for
        a folder without one (gyre's warm-start and random policies), which the proxy renders
        with the bundled Qwen3.6 vocabulary."""
        folder = Path(self.config.model.init)
        if any((folder / name).is_file() for name in TOKENIZER_FILES):
            return ["--model", str(folder)]
        if not (folder / "warmstart.json").is_file():
            console.print(
                f"[yellow]{folder} holds no tokenizer ({', '.join(TOKENIZER_FILES)}): the proxy "
                "renders with the bundled Qwen3.6 vocabulary and gyre's Qwen3 template[/yellow]"
            )
        return []

    def _register_external_engines(self) -> None:
        """Register each engine of ``external_engines`` for this life of the run, once it serves
        the run's newest policy (or its starting one): it loads that folder, as the version it
        is, so what it answers is recorded with a policy version. It must read ``run_dir`` at
        the same path (train.publish = "disk" needs that anyway)."""
        externals = self.config.externals
        if not externals:
            return
        version = self._published()
        # The core's folder of a published version (gyre_train.cells.policy_dir).
        folder = Path(self.config.run_dir) / "policies" / f"policy-v{version}"
        if version == 0 or not (folder / "config.json").is_file():
            version, folder = 0, Path(self.config.model.init)

        async def load(engine: ExternalEngine) -> None:
            async with EngineClient(EngineClientConfig(engine.url, timeout_s=600.0)) as client:
                await client.update_weights_from_disk(str(folder), weight_version=str(version))

        meta = EventMetadata(run_id=self.run_id)
        for engine in externals:
            try:
                asyncio.run(load(engine))
            except EngineError as exc:
                raise RunFailed(
                    f"external engine {engine.name} ({engine.url}) did not load the policy {folder}: {exc}"
                ) from exc
            registered = EngineRegistered(
                engine=external_name(self.run_id, engine.name), run_id=self.run_id, url=engine.url,
                cell_index=-1, capacity=engine.capacity,
            )  # fmt: skip
            key = f"engine:{registered.engine}:{engine.url}:{uuid.uuid4().hex[:12]}"
            self.log.append([NewEvent(registered, key, metadata=meta)])

    def _nodes(self, gyre: list[str], run: list[str]) -> dict[str, list[str]]:
        """One node agent per configured node: the engines spread over them, the trainer cells on
        the first (on a cluster, each machine runs its own `gyre node serve` the same way)."""
        n, engines = self.config.nodes, self.config.rollout_engines
        share = [engines // n + (i < engines % n) for i in range(n)]
        return {
            ("node" if i == 0 else f"node-{i}"): [
                *gyre,
                "node",
                "serve",
                *run,
                "--engines",
                str(share[i]),
                "--engine-offset",
                str(sum(share[:i])),
                "--trainers",
                self.config.trainers if i == 0 else "none",
            ]
            for i in range(n)
        }

    def _spawn(self, name: str) -> None:
        self._spawned[name] = time.monotonic()
        out = (Path(self.config.run_dir) / "logs" / f"{name}.log").open("ab")
        self.children[name] = subprocess.Popen(
            self.commands[name],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )

    def _check_children(self) -> None:
        """Start again a process that died: each recovers its state from the log (the trainer
        from the last publication), so the run goes on. A restart waits 2^n seconds, and more
        than ``max_restarts`` deaths in a row, each soon after its start, end the run
        (``RestartPolicy``)."""
        now = time.monotonic()
        for name, child in list(self.children.items()):
            code = child.poll()
            if code is None:
                continue
            log = f"{self.config.run_dir}/logs/{name}.log"
            if code == GAVE_UP:
                self.failed = f"the {name} process gave up on what it runs (exit {code}; see {log})"
                raise RunFailed(self.failed)
            if name not in self._due:
                policy = self._policies.setdefault(name, RestartPolicy(max_in_a_row=self.max_restarts))
                pause = policy.died(lived_s=now - self._spawned.get(name, now))
                if pause is None:
                    self.failed = (
                        f"the {name} process exited {code}, {policy.in_a_row} times in a row, each soon "
                        f"after it started (see {log})"
                    )
                    raise RunFailed(self.failed)
                self._due[name] = now + pause
            if now < self._due[name]:
                continue
            del self._due[name]
            self.restarts[name] = self.restarts.get(name, 0) + 1
            console.print(f"[yellow]the {name} process exited {code}; starting it again (see {log})[/yellow]")
            self._spawn(name)

    def _wait_for_engines(self, timeout_s: float, after: int = 0) -> None:
        """Until every engine of this life registered: the pool's, and the cells' when they move
        between roles (elastic and colocate cells start in rollout)."""
        c = self.config
        expected = c.rollout_engines + len(c.externals) + (c.cells if c.cells_move else 0)
        deadline = time.monotonic() + timeout_s
        while len(self._engines(after)) < expected:
            self._check_children()
            if time.monotonic() > deadline:
                raise RunFailed(f"the rollout engines did not register within {timeout_s:.0f} s")
            time.sleep(0.2)

    def _engines(self, after: int = 0) -> set[str]:
        return {
            r.event.engine
            for r in self.log.read(after, types=["engine.registered"], limit=100_000)
            if isinstance(r.event, EngineRegistered) and r.event.run_id == self.run_id
        }

    def stop(self) -> None:
        """Stop the processes in waves, each waited for before the next: the controller (no
        more dispatch), then the launcher (it kills the harnesses still running and records
        them cancelled), then the evaluator, then the proxy and the node agents. Stopped all at
        once, the proxy went first and a harness still running saw its model API refuse the
        connection before the launcher had ended it."""
        for wave in stop_waves(list(self.children)):
            children = [self.children[name] for name in wave]
            for child in children:
                if child.poll() is None:
                    child.terminate()
            deadline = time.monotonic() + 20
            for child in children:
                try:
                    child.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(5)

    # -- the run -----------------------------------------------------------------------------------

    def follow(self, *, live_view: bool, sinks: frozenset[str] = frozenset()) -> None:
        """Record ``run.started`` and follow the run to its last publication: the live table on a
        terminal (``live_view``), one line per step as it lands off one, and each step's scalars
        as it lands: TensorBoard (``sinks`` has "tensorboard") and W&B (``self.wandb``)."""
        c = self.config
        if c.eval.heldout:
            with self.phase("held-out before"):
                self._held_out("heldout-before")
        if not any(
            isinstance(r.event, RunStarted) for r in self.log.read_stream(StreamId("run", self.run_id))
        ):
            started = RunStarted(
                run_id=self.run_id, harness=c.harness, model=c.model.init, group_size=c.N, batch_groups=c.B,
                cells=c.cells, cell_capacity=c.engine_capacity,
                separate_capacity=c.pool_capacity, phi=c.phi, mu=c.mu,
                max_trajectories=c.train.jmax,
                fixed_training_cells=0 if c.cells_move else c.cells,
            )  # fmt: skip
            self.log.append(
                [NewEvent(started, f"started:{self.run_id}", metadata=EventMetadata(run_id=self.run_id))]
            )
        steps = StepFollower(self.log, self.run_id, phi=c.phi, mu=c.mu)
        lines = not console.is_terminal  # a log file or a pipe: one line per step
        board = (
            TensorBoardSteps(Path(c.run_dir) / "tensorboard")
            if "tensorboard" in sinks
            else contextlib.nullcontext()
        )

        def landed() -> None:
            for step in _patient(steps.poll):
                if lines:
                    console.print(step_line(step), markup=False)
                if isinstance(board, TensorBoardSteps):
                    board.write(step)
                    self.written_steps.add(step.step)
                if self.wandb is not None:
                    self.wandb.write(step)

        with (
            self.phase("steps"),
            board,
            Live(self._view(), console=console, refresh_per_second=2, transient=not live_view) as live,
        ):
            viewed = time.monotonic()
            while _patient(self._published) < c.steps:
                self._check_children()
                time.sleep(0.5)
                landed()
                # The view reads the run's report from the log: every 2 s, since the processes
                # it watches share the same cores.
                if live_view and time.monotonic() - viewed >= VIEW_EVERY_S:
                    live.update(_patient(self._view))
                    viewed = time.monotonic()
            landed()  # the last step too
            if live_view:
                live.update(_patient(self._view))
            self._settle_transitions(timeout_s=60.0)
        if c.eval.heldout:
            with self.phase("held-out after"):
                self._held_out("heldout-after")

    def _settle_transitions(self, timeout_s: float) -> None:
        """After the last publication, let the transitions already begun (the cells returning to
        rollout at the last burst end) complete, so the run ends with every cell in a role."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            report = _patient(
                lambda: run_report(self.log, self.run_id, phi=self.config.phi, mu=self.config.mu)
            )
            if all(t.total_s is not None for t in report.transition_times):
                return
            self._check_children()
            time.sleep(0.2)

    def _published(self) -> int:
        versions = [
            r.event.policy_version
            for r in self.log.read_stream(StreamId("policy", self.run_id))
            if isinstance(r.event, WeightsPublished)
        ]
        return max(versions, default=0)

    def _held_out(self, name: str) -> None:
        """Run every held-out task once in the side run ``<run>~<name>`` and wait for the scores."""
        side = f"{self.run_id}~{name}"
        tasks = [
            r.event.task_id
            for r in self.log.read(0, types=["task.defined"], limit=1_000_000)
            if isinstance(r.event, TaskDefined)
            and r.event.run_id == self.run_id
            and r.event.split is TaskSplit.HELDOUT
        ]
        meta = EventMetadata(run_id=side)
        events: list[NewEvent] = []
        for i, task in enumerate(tasks):
            eid = f"{side}/e{i}"
            events.append(
                NewEvent(
                    ExecutionDispatched(
                        execution_id=eid, run_id=side, group_id=f"{side}/g0", policy_version=self._published()
                    ),
                    f"dispatch:{eid}",
                    metadata=meta,
                )
            )
            events.append(
                NewEvent(
                    ExecutionStartRequested(
                        execution_id=eid,
                        run_id=side,
                        task_id=task,
                        engine="pool",
                        harness=self.config.harness,
                    ),
                    f"start:{eid}",
                    metadata=meta,
                )
            )
        self.log.append(events)
        with console.status(f"held-out evaluation {name}: {len(tasks)} tasks") as status:
            while True:
                self._check_children()
                report = _patient(
                    lambda: run_report(self.log, self.run_id, phi=self.config.phi, mu=self.config.mu)
                )
                done = next((h for h in report.held_out if h.name == name), None)
                scored = done.executions if done else 0
                status.update(f"held-out evaluation {name}: {scored}/{len(tasks)} scored")
                if scored >= len(tasks):
                    return
                time.sleep(0.5)

    def _view(self) -> Table:
        report = run_report(self.log, self.run_id, phi=self.config.phi, mu=self.config.mu)
        table = Table(
            title=f"gyre run {self.run_id} ({self.config.policy}, phi={self.config.phi}, mu={self.config.mu})"
        )
        for column in ("step", "version", "reward", "groups", "trajectories", "tokens", "loss", "wall s"):
            table.add_column(column, justify="right")
        for s in report.steps[-12:]:
            table.add_row(
                str(s.step), str(s.policy_version), _fmt(s.mean_reward), str(s.groups), str(s.admitted_trajectories),
                str(s.trainable_tokens), _fmt(s.loss), _fmt(s.wall_s, 1),
            )  # fmt: skip
        counts = self._lifecycle.update(self.log)
        roles = {span.cell: span.role for span in report.role_timeline}  # each cell's latest role
        cells = ", ".join(f"{n} {role}" for role in ("rollout", "training", "transitioning")
                          if (n := sum(r == role for r in roles.values())))  # fmt: skip
        table.caption = (
            f"d={counts['d']} p={counts['p']} f={counts['f']}  waterlevel w={counts['d'] - counts['f']}  "
            f"queued={counts['d'] - counts['p']} running={counts['p'] - counts['f']}  "
            f"engines: {self.config.rollout_engines} {self.config.engine} in the pool"
            f"{f' + {n} external' if (n := len(self.config.externals)) else ''}; cells: {cells or self.config.cells}; "
            f"transitions {report.transitions}  published v{self._published()}/{self.config.steps}"
        )
        return table

    def verdict(self, summary: dict[str, Any]) -> str:
        if self.failed:
            return f"[red]run {self.run_id} failed: {self.failed}[/red]"
        return summary.get("verdict", "")


def external_name(run_id: str, name: str) -> str:
    """The log's name of external engine ``name`` of a run (engine names are unique in the log)."""
    return f"{run_id}:ext-{name}"


def _die_with_parent() -> None:
    """In a child, before it runs: a SIGTERM when ``gyre run`` dies, however it dies (Linux), so
    a run started again never meets the processes of its previous life."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

STOP_ORDER = ("controller", "launcher", "evaluator")  # then everything else at once


def stop_waves(names: list[str]) -> list[list[str]]:
    """The order ``LiveRun.stop`` ends the processes in: one wave per name of ``STOP_ORDER``,
    then the rest (the proxy and the node agents) together."""
    waves = [[name] for name in STOP_ORDER if name in names]
    rest = [name for name in names if name not in STOP_ORDER]
    return [*waves, rest] if rest else waves


T = TypeVar("T")


def _patient(read: Callable[[], T], patience_s: float = 120.0) -> T:
    """``read()`` of the log, waiting out a database that is down for a while."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return read()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


class RunFailed(RuntimeError):
    """A process of the run died or the run could not go on."""


VIEW_EVERY_S = 2.0
_KINDS = {"execution.dispatched": "d", "execution.started": "p", "execution.finished": "f"}


@dataclass
class Lifecycle:
    """The run's counters d, p, f, read from the log incrementally (each event once)."""

    run_id: str
    counts: dict[str, int] = field(default_factory=lambda: {"d": 0, "p": 0, "f": 0})
    after: int = 0

    def update(self, log: EventLog) -> dict[str, int]:
        events, self.after = read_to_head(log, self.after, types=list(_KINDS))
        for recorded in events:
            if getattr(recorded.event, "run_id", None) == self.run_id:
                self.counts[_KINDS[recorded.event_type]] += 1
        return dict(self.counts)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _replace(config: RunConfig, *, run_id: str, run_dir: str, init: str) -> RunConfig:
    import msgspec

    model = msgspec.structs.replace(config.model, init=init)
    return msgspec.structs.replace(config, run_id=run_id, run_dir=run_dir, model=model)
