"""The run's ``[sandbox]`` for its launcher and evaluator: workspaces written from task sources,
harnesses started in the run's sandbox kind, and tests run in the same kind.

Under ``local`` the harness runs on the host as it always has (``sandboxed`` is False); only
workspaces of sourced tasks are written here. Under ``bwrap``, ``podman`` and ``docker`` each
harness runs in a sandbox of its own (a container kind's in the task's image, its Dockerfile
built, as its tests): the workspace writable at the task's working directory, a
private HOME at ``/home/agent``, the harness's program read-only, the environment the harness
needs and nothing of the launcher's, limits on processes, file size and CPU time, a cap on
what its writable binds hold together (``disk_mb``, ``gyre_train.sandbox.disk``), and one
network route: the proxy's port, relayed through a unix socket (``gyre_train.sandbox.relay``).
The execution's snapshots folder is writable at ``/gyre/snapshots``, for ``.gyre/evaluate``.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from gyre_proxy.harness import LaunchSpec
from gyre_proxy.launch import SANDBOX_SNAPSHOTS, ExecutionDirs, LaunchError, Placed
from gyre_store import TaskDefined
from gyre_train import GyreTrainError
from gyre_train.sandbox import Bind, Limits, ProxyRoute, Sandbox, UnixRelay, sandbox_for
from gyre_train.tasks import DEFAULT_WORKDIR, TaskFiles, limits_for, sandbox_for_task

HOME = "/home/agent"
PACKAGES = ("gyre_store", "gyre_proxy", "gyre_sched", "gyre_train")
HARNESS_LIMITS = Limits(processes=256, file_size_mb=1024)


class SandboxPlacement:
    """A ``gyre_proxy.launch.Placement`` for one run (see the module docstring)."""

    def __init__(
        self,
        kind: str,
        *,
        proxy_url: str,
        relay_dir: Path,
        files: TaskFiles | None = None,
        disk_mb: int | None = None,
    ) -> None:
        try:
            self._sandbox: Sandbox = sandbox_for(kind)
        except GyreTrainError as exc:
            raise LaunchError(str(exc)) from exc
        self.kind = kind
        self.files = files or TaskFiles()
        self.disk_mb = disk_mb  # the [sandbox] disk_mb of the run; None: no cap
        self._relay: object | None = None
        self._route: ProxyRoute | None = None
        if self.sandboxed:
            parts = urlsplit(proxy_url)
            if parts.hostname is None or parts.port is None:
                raise LaunchError(f"proxy URL {proxy_url!r} names no host and port")
            relay_dir.mkdir(parents=True, exist_ok=True)
            relay_dir.chmod(0o755)
            socket = relay_dir / "proxy.sock"
            relay = UnixRelay(socket, parts.hostname, parts.port)
            relay.start()
            self._relay = relay
            self._route = ProxyRoute(socket, parts.port)

    @property
    def sandboxed(self) -> bool:
        return self.kind != "local"

    def close(self) -> None:
        relay, self._relay = self._relay, None
        if relay is not None:
            relay.close()  # type: ignore[attr-defined]

    def write_workspace(self, task: TaskDefined, workspace: Path) -> None:
        try:
            self.files.write_workspace(task, workspace)
        except (GyreTrainError, OSError) as exc:
            raise LaunchError(f"task {task.task_id}: workspace not written: {exc}") from exc

    def inside(self, task: TaskDefined, dirs: ExecutionDirs) -> tuple[Path, Path]:
        if not self.sandboxed:
            return dirs.workspace, dirs.home
        return Path(task.workdir or DEFAULT_WORKDIR), Path(HOME)

    def place(self, spec: LaunchSpec, task: TaskDefined, dirs: ExecutionDirs, name: str) -> Placed:
        workdir, home = self.inside(task, dirs)
        argv, env = list(spec.argv), dict(spec.env)
        binds = [Bind(p, str(p)) for p in _program_binds(spec.argv)]
        limits = HARNESS_LIMITS
        sandbox = self._sandbox
        if task.source:
            sourced = self.files.task(task)
            limits = limits_for(sourced, task.budget_s)
            limits = Limits(processes=limits.processes, file_size_mb=limits.file_size_mb, cpu_s=limits.cpu_s)
            try:  # under podman and docker the harness runs in the task's image, as its tests do
                sandbox = sandbox_for_task(sourced, sandbox)
            except GyreTrainError as exc:
                raise LaunchError(f"sandbox {self.kind}: task {task.task_id}: {exc}") from exc
        if argv and argv[0] == sys.executable:  # a Python harness: the sandbox's python, gyre's packages
            argv[0] = sandbox.python
            env["PYTHONPATH"] = ":".join(str(p) for p in _python_paths())
            env["PYTHONDONTWRITEBYTECODE"] = "1"
            binds += [Bind(p, str(p)) for p in _python_binds()]
        binds = [
            Bind(dirs.workspace, str(workdir), writable=True),
            Bind(dirs.home, str(home), writable=True),
            *binds,
        ]
        snapshots = dirs.root / "snapshots"
        if snapshots.is_dir():  # intermediate evaluations (.gyre/evaluate) write their snapshots here
            binds.append(Bind(snapshots, SANDBOX_SNAPSHOTS, writable=True))
        limits = replace(limits, disk_mb=self.disk_mb)
        try:
            prepared = sandbox.prepare(
                argv, workdir=str(workdir), name=name, binds=binds, env=env, limits=limits, route=self._route
            )
        except GyreTrainError as exc:
            raise LaunchError(f"sandbox {self.kind}: {exc}") from exc
        return Placed(tuple(prepared.argv), dict(prepared.env), prepared.cleanup)


def _python_paths() -> list[Path]:
    root = Path(__file__).resolve().parent.parent
    return [root, Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["platlib"])]


def _python_binds() -> list[Path]:
    root = Path(__file__).resolve().parent.parent
    found = [root / p for p in PACKAGES if (root / p).is_dir()]
    found += [Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")]
    return sorted(set(found))


def _program_binds(argv: Sequence[str]) -> list[Path]:
    """The folder of a harness program outside ``/usr`` (a CLI installed by npm, say)."""
    if not argv or not argv[0].startswith("/") or argv[0] == sys.executable or argv[0].startswith("/usr/"):
        return []
    program = Path(argv[0]).resolve()
    for parent in program.parents:
        if parent.name == "node_modules":
            return [parent.parent]
    return [program.parent]
