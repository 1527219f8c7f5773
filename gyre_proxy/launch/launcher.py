"""The launcher: starts each execution the scheduler asks for, and records how it ended.

It follows a run's ``execution.start_requested`` events. For each one it builds a fresh
workspace from the task, issues the execution its own API key, records
``execution.started`` (the moment the counter p moves), and starts the harness process
pointed at the proxy. It supervises every running harness against its task's wall-clock
budget; when one exits or overruns, it preserves the workspace (``artifact.preserved``, for
the evaluators), revokes the key and records ``execution.finished`` with the real reason:
``completed`` (exit 0), ``failed`` (any other exit, or no start), ``harness_timeout`` (killed at
its budget). Every workspace also gets ``.gyre/evaluate``, the command through which the
execution may ask for an intermediate evaluation (evaluate_command.py). Nothing here decides
when executions start or how they are scored.

A restarted launcher rebuilds its state from the log: requests not yet started are started,
and executions it had started are finished as failed (their harness processes are gone), so
their partial work is still scored. Several launchers may follow one run, one per host, each
under its own ``name`` and with its own ``max_running``: a launcher with room takes a request by
recording ``execution.started`` (idempotent per execution) before it touches the workspace, and
only the one whose record lands first prepares the workspace and starts the harness; the
others pass it by. A restarted launcher finishes only the executions its own name started.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gyre_proxy.exceptions import HarnessError, LaunchError
from gyre_proxy.harness import CODEX_KEY_ENV, HarnessPlugin, Launch, LaunchSpec, plugin_for
from gyre_proxy.launch.evaluate_command import install as install_evaluate_command
from gyre_proxy.launch.liveness import Liveness
from gyre_proxy.launch.placement import SANDBOX_SNAPSHOTS, Placement
from gyre_proxy.launch.processes import HarnessProcess, Starter
from gyre_proxy.launch.workspace import ExecutionDirs, artifact_version, prepare, safe_name
from gyre_proxy.service import SNAPSHOTS, issue_key, revoke_key
from gyre_store import (
    ArtifactPreserved,
    ExecutionFinished,
    ExecutionStarted,
    ExecutionStartRequested,
    FinishReason,
    TaskDefined,
)
from gyre_store.log import Event, EventLog, EventMetadata, NewEvent, RunFollower, base_run

CHECK_LOST_S = 2.0  # how often a launcher looks for lost ones (with a ``liveness``)
FOLLOWED = ("task.defined", "execution.start_requested", "execution.started", "execution.finished")
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TMPDIR", "TZ")  # the launcher's own secrets stay here


@dataclass(frozen=True, slots=True)
class LauncherConfig:
    """Which run to serve, where the proxy is, where workspaces go, and how to start harnesses."""

    run_id: str
    proxy_url: str
    root: Path
    harness: str = "builtin"
    model: str = "gyre-policy"
    poll_s: float = 0.2
    kill_grace_s: float = 2.0
    max_running: int = 0  # harness processes at once (0: no limit); requests beyond it wait
    fork_entries: bool = True  # start a Python harness forked ready-imported (processes.py)
    boot_retries: int = 2  # starts again of a harness that died while booting
    boot_window_s: float = 10.0  # a non-zero exit this soon after the start is a death while booting
    max_booting: int = 0  # harnesses started within boot_window_s at once (0: no cap)
    name: str = ""  # this launcher among the run's (one per host): recorded in execution.started


def _nothing() -> None:
    return None


@dataclass
class Running:
    request: ExecutionStartRequested
    dirs: ExecutionDirs
    process: HarnessProcess
    api_key: str
    deadline: float
    cleanup: Callable[[], None] = _nothing
    started_at: float = 0.0
    boots: int = 1  # harness starts (a harness that died while booting is started again)


class Launcher:
    """Follows one run's start requests; ``run(stop)`` until stopped, ``step()`` once."""

    def __init__(
        self,
        log: EventLog,
        config: LauncherConfig,
        *,
        plugin: HarnessPlugin | None = None,
        clock: Callable[[], float] = time.monotonic,
        placement: Placement | None = None,
        liveness: Liveness | None = None,
    ) -> None:
        self.log = log
        self.placement = placement
        self.liveness = liveness
        self._seen_alive: set[str] = set()  # launchers that beat once: only those can be lost
        self._checked_at = -math.inf
        self.config = config
        self.plugin = plugin or plugin_for(config.harness)
        self._clock = clock
        self._starter = Starter(fork_entries=config.fork_entries)
        self._tasks: dict[tuple[str, str], TaskDefined] = {}
        self._pending: dict[str, ExecutionStartRequested] = {}
        self._started: set[str] = set()
        self._finished: set[str] = set()
        self._elsewhere: dict[str, str] = {}  # started by another launcher of the run: its name
        self._running: dict[str, Running] = {}
        self._run_of: dict[str, str] = {}
        # The run's events and its side runs' (held-out evaluations, say).
        self._follower = RunFollower(log, config.run_id, FOLLOWED, self._note)
        self._recover()

    # -- state from the log ------------------------------------------------------------------

    def _recover(self) -> None:
        self._follower.read_new()
        for execution_id in sorted(self._started - self._finished):
            if execution_id in self._running:
                continue
            request = self._pending.pop(execution_id, None)
            run_id = (
                request.run_id if request is not None else self._run_of.get(execution_id, self.config.run_id)
            )
            dirs = ExecutionDirs(self.config.root / safe_name(execution_id))
            self._finish(
                execution_id,
                run_id,
                dirs,
                FinishReason.FAILED,
                "the launcher restarted: the harness process was lost",
            )

    def _note(self, event: Event, run_id: str) -> None:
        match event:
            case TaskDefined(task_id=task_id):
                self._tasks[(run_id, task_id)] = event
            case ExecutionStartRequested(execution_id=execution_id):
                self._run_of[execution_id] = run_id
                if not any(execution_id in seen for seen in (self._started, self._finished, self._elsewhere)):
                    self._pending[execution_id] = event
            case ExecutionStarted(execution_id=execution_id, launcher=launcher):
                self._run_of[execution_id] = run_id
                # Another launcher's executions are its own to run and to finish (one recorded
                # before launchers had names was the run's only launcher's: ours).
                if launcher in (self.config.name, ""):
                    self._started.add(execution_id)
                else:
                    self._elsewhere[execution_id] = launcher
                self._pending.pop(execution_id, None)
            case ExecutionFinished(execution_id=execution_id):
                self._finished.add(execution_id)
                self._pending.pop(execution_id, None)
                self._elsewhere.pop(execution_id, None)

    # -- the loop ----------------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def booting(self) -> int:
        """Harnesses started less than ``boot_window_s`` ago (their sandboxes still booting)."""
        now = self._clock()
        return sum(1 for r in self._running.values() if now - r.started_at < self.config.boot_window_s)

    def step(self) -> None:
        """Read new requests, start what is pending, and reap or kill what ended."""
        if self.liveness is not None:
            self.liveness.beat()  # before any start: a launcher is seen alive before its executions
        self._follower.read_new()
        self._finish_the_lost()
        limit, booting_cap = self.config.max_running, self.config.max_booting
        for execution_id in list(self._pending):
            if limit and len(self._running) >= limit:
                break  # started in request order once a harness ends
            if booting_cap and self.booting >= booting_cap:
                break  # started once a boot is over
            self._start(self._pending.pop(execution_id))
        now = self._clock()
        for execution_id, run in list(self._running.items()):
            code = run.process.poll()
            if code is not None and self._boot_again(execution_id, code):
                continue
            if code is not None:
                reason = FinishReason.COMPLETED if code == 0 else FinishReason.FAILED
                self._reap(execution_id, reason, f"harness exited {code}")
            elif now >= run.deadline:
                self._kill(run)
                self._reap(execution_id, FinishReason.HARNESS_TIMEOUT, "killed at the end of its budget")

    def _finish_the_lost(self) -> None:
        """Finish, as failed, the executions of another launcher that stopped beating (lost with
        its host): their harnesses are gone or unreachable, and nobody else would end them. Their
        preserved work is still scored; if the launcher comes back, its own finish is a duplicate."""
        liveness, now = self.liveness, self._clock()
        if liveness is None or now - self._checked_at < CHECK_LOST_S:
            return
        self._checked_at = now
        owners = {o for o in self._elsewhere.values() if o}
        for owner in sorted(owners):
            alive = liveness.alive(owner)
            if alive:
                self._seen_alive.add(owner)
                continue
            if alive is None or owner not in self._seen_alive:
                continue  # cannot tell now, or never seen beating (not one to judge)
            for execution_id in sorted(e for e, o in self._elsewhere.items() if o == owner):
                self._finish(
                    execution_id,
                    self._run_of.get(execution_id, self.config.run_id),
                    ExecutionDirs(self.config.root / safe_name(execution_id)),
                    FinishReason.FAILED,
                    f"its launcher {owner} was lost (no heartbeat); finished by {self.config.name}",
                )
                del self._elsewhere[execution_id]

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set; then kill what still runs and record it as cancelled."""
        try:
            self._follower.run(stop, self.step, self.config.poll_s)
        finally:
            for execution_id, run in list(self._running.items()):
                self._kill(run)
                self._reap(execution_id, FinishReason.CANCELLED, "the launcher stopped")

    # -- one execution -----------------------------------------------------------------------

    def _task_of(self, request: ExecutionStartRequested) -> TaskDefined | None:
        """The request's task: defined in its run (a side run uses its run's tasks)."""
        return self._tasks.get((base_run(request.run_id), request.task_id))

    def _start(self, request: ExecutionStartRequested) -> None:
        meta = EventMetadata(run_id=request.run_id)
        task = self._task_of(request)
        root = self.config.root / safe_name(request.execution_id)
        if task is None:
            self._finish(
                request.execution_id,
                request.run_id,
                ExecutionDirs(root),
                FinishReason.FAILED,
                f"no task {request.task_id!r} is defined in run {request.run_id!r}",
            )
            return
        # Taken first: of the launchers that try, only the one whose record lands goes on to
        # write the workspace (a folder every host may share) and start the harness.
        started = ExecutionStarted(
            execution_id=request.execution_id,
            run_id=request.run_id,
            engine=request.engine,
            launcher=self.config.name,
            folder=str((self.config.root / safe_name(request.execution_id)).absolute()),
        )
        [result] = self.log.append([NewEvent(started, f"started:{request.execution_id}", metadata=meta)])
        if result.duplicate:
            self._elsewhere.setdefault(request.execution_id, "")  # another launcher's landed first
            return
        self._started.add(request.execution_id)
        placement = self.placement
        try:
            dirs = prepare(
                self.config.root,
                request.execution_id,
                task,
                write=placement.write_workspace if placement is not None else None,
            )
        except LaunchError as exc:  # no workspace: nothing evaluable, a zero-reward placeholder
            self._finish(
                request.execution_id, request.run_id, ExecutionDirs(root), FinishReason.FAILED, str(exc)
            )
            return
        api_key = issue_key(
            self.log, execution_id=request.execution_id, run_id=request.run_id, harness=self.plugin.name
        )
        deadline = self._clock() + task.budget_s
        try:
            process, cleanup = self._spawn(request, task, dirs, api_key)
        except (HarnessError, LaunchError, OSError) as exc:
            if isinstance(exc, LaunchError):  # the sandbox could not boot: nothing evaluable
                shutil.rmtree(dirs.workspace, ignore_errors=True)
            self._finish(
                request.execution_id, request.run_id, dirs, FinishReason.FAILED, f"not started: {exc}"
            )
            revoke_key(self.log, api_key, "not started")
            return
        self._running[request.execution_id] = Running(
            request, dirs, process, api_key, deadline, cleanup, started_at=self._clock()
        )

    def _spawn(
        self, request: ExecutionStartRequested, task: TaskDefined, dirs: ExecutionDirs, api_key: str
    ) -> tuple[HarnessProcess, Callable[[], None]]:
        """Start the harness in ``dirs``; raises HarnessError, LaunchError (its sandbox cannot be
        prepared) or OSError, having cleaned up what it prepared."""
        placement = self.placement
        sandboxed = placement is not None and placement.sandboxed
        workspace, home = (
            placement.inside(task, dirs) if placement is not None else (dirs.workspace, dirs.home)
        )
        launch = Launch(workspace, home, task.prompt, self.config.proxy_url, api_key, self.config.model)
        spec = self.plugin.launch_spec(launch)
        cleanup = _nothing
        # Intermediate evaluations (.gyre/evaluate): snapshots go to the execution's snapshots
        # folder, the only location the proxy evaluates for it.
        snapshots = dirs.root.absolute() / SNAPSHOTS
        evaluate_url = self.config.proxy_url.rstrip("/") + "/gyre/v1/evaluate"
        if sandboxed:
            # In a sandbox the harness gets its own environment only (no GYRE_ setting but its
            # key): the command reads where to post and write from .gyre/evaluate.json, and the
            # placement binds the snapshots folder writable at SANDBOX_SNAPSHOTS.
            assert placement is not None
            snapshots.mkdir(exist_ok=True)
            install_evaluate_command(
                dirs.workspace, url=evaluate_url, snapshots=SANDBOX_SNAPSHOTS, recorded=str(snapshots)
            )
            # The one GYRE_ name a sandbox passes on: the execution's key (Codex's name for it).
            keyed = LaunchSpec(spec.argv, env={CODEX_KEY_ENV: api_key} | dict(spec.env), stdin=spec.stdin)
            placed = placement.place(keyed, task, dirs, safe_name(request.execution_id))
            cleanup = placed.cleanup
            spec = LaunchSpec(placed.argv, stdin=spec.stdin)
            env = dict(placed.env)
        else:
            install_evaluate_command(dirs.workspace)
            env = (
                {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
                | {
                    "GYRE_EVALUATE_URL": evaluate_url,
                    "GYRE_EXECUTION_KEY": api_key,
                    "GYRE_SNAPSHOTS": str(snapshots),
                }
                | dict(spec.env)
            )
        try:
            return self._starter.start(spec, cwd=dirs.workspace, env=env, log=dirs.harness_log), cleanup
        except OSError:
            cleanup()
            raise

    def _boot_again(self, execution_id: str, code: int) -> bool:
        """A harness that died while booting (a non-zero exit within ``boot_window_s`` of its
        start) is started again on a fresh workspace, at most ``boot_retries`` times and only
        inside its budget; returns whether it was."""
        run = self._running[execution_id]
        now = self._clock()
        if (
            code == 0
            or run.boots > self.config.boot_retries
            or now - run.started_at > self.config.boot_window_s
            or now >= run.deadline
        ):
            return False
        task = self._task_of(run.request)
        if task is None:
            return False
        run.cleanup()
        log_tail = run.dirs.harness_log.read_bytes()[-2000:] if run.dirs.harness_log.exists() else b""
        try:
            dirs = prepare(
                self.config.root,
                execution_id,
                task,
                write=self.placement.write_workspace if self.placement is not None else None,
            )
            dirs.harness_log.write_bytes(
                log_tail + f"\n[gyre] harness exited {code} while booting: started again\n".encode()
            )
            process, cleanup = self._spawn(run.request, task, dirs, run.api_key)
        except (HarnessError, LaunchError, OSError):
            return False
        run.dirs, run.process, run.cleanup = dirs, process, cleanup
        run.started_at, run.boots = now, run.boots + 1
        return True

    def _kill(self, run: Running) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.process.pid, sig)
            try:
                run.process.wait(self.config.kill_grace_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def _reap(self, execution_id: str, reason: FinishReason, detail: str) -> None:
        run = self._running.pop(execution_id)
        try:
            run.cleanup()
        except Exception as exc:  # a sandbox left behind is noted, and the execution still ends
            detail = f"{detail} (sandbox cleanup failed: {exc})"
        tail = run.dirs.harness_log.read_bytes()[-300:].decode(errors="replace").strip()
        if reason is not FinishReason.COMPLETED and tail:
            detail = f"{detail}: {tail}"
        self._finish(execution_id, run.request.run_id, run.dirs, reason, detail)
        revoke_key(self.log, run.api_key, f"execution {reason.value}")

    def _finish(
        self, execution_id: str, run_id: str, dirs: ExecutionDirs, reason: FinishReason, detail: str
    ) -> None:
        meta = EventMetadata(run_id=run_id)
        events: list[NewEvent] = []
        if dirs.workspace.is_dir():
            version = artifact_version(dirs.workspace)
            preserved = ArtifactPreserved(
                execution_id=execution_id,
                run_id=run_id,
                artifact_version=version,
                location=str(dirs.workspace),
            )
            events.append(NewEvent(preserved, f"preserved:{execution_id}:final", metadata=meta))
        finished = ExecutionFinished(
            execution_id=execution_id, run_id=run_id, reason=reason, detail=detail[:2000]
        )
        events.append(NewEvent(finished, f"finished:{execution_id}", metadata=meta))
        self.log.append(events)
        self._finished.add(execution_id)


def default_root(data_dir: Path, run_id: str) -> Path:
    """Where a run's workspaces go under a data folder."""
    return Path(data_dir) / "workspaces" / safe_name(run_id)
