"""The sandbox provider interface: run one command with a working directory, bind mounts, an
environment built from nothing, a timeout and resource limits, and report how it ended.

A sandbox knows nothing of tasks: which folders are bound where, and what a command means, is
the caller's (``gyre_train.tasks.check``). Each kind is one module beside this one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gyre_train.exceptions import SandboxError

TAIL_CHARS = 4000  # what a result keeps of stdout and stderr
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
DEFAULT_LANG = "C.UTF-8"
GRACE_S = 5.0  # how long to wait for pipes to close after the group was killed


@dataclass(frozen=True, slots=True)
class Bind:
    """A host folder or file visible in the sandbox at ``target``."""

    source: Path
    target: str
    writable: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits, each applied as an rlimit of the command (None: no limit), but
    ``disk_mb``.

    ``memory_mb`` is the address space, ``cpu_s`` the CPU time, ``processes`` the number of
    processes of the sandbox's user, ``file_size_mb`` the largest file it may write.
    ``disk_mb`` is the total its writable binds may hold, a file system of that size
    (``gyre_train.sandbox.disk``) under ``bwrap``, ``podman`` and ``docker``; ``local`` ignores it.
    """

    memory_mb: int | None = None
    cpu_s: int | None = None
    processes: int | None = None
    file_size_mb: int | None = None
    disk_mb: int | None = None

    def prlimit(self) -> list[str]:
        """``prlimit`` arguments that apply these limits to the command after ``--``."""
        args = ["prlimit"]
        if self.memory_mb is not None:
            args.append(f"--as={self.memory_mb * 2**20}")
        if self.cpu_s is not None:
            args.append(f"--cpu={self.cpu_s}")
        if self.processes is not None:
            args.append(f"--nproc={self.processes}")
        if self.file_size_mb is not None:
            args.append(f"--fsize={self.file_size_mb * 2**20}")
        return [*args, "--"] if len(args) > 1 else []


NO_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a command ended: exit code (negative: killed by that signal), output tails, time."""

    exit_code: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """The one address a sandboxed process may reach: ``127.0.0.1:port`` inside the sandbox is
    forwarded, through the unix socket ``socket`` on the host, to the proxy (the caller serves
    ``socket``; ``gyre_train.sandbox.relay``)."""

    socket: Path
    port: int


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A long-running sandboxed process, ready to start: the caller runs ``argv`` with exactly
    ``env`` in a process group of its own, and calls ``cleanup`` once it has ended or was killed
    (a container is removed there, say)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cleanup: Callable[[], None] = _nothing


class Sandbox(ABC):
    """One kind of sandbox. ``remaps``: whether a bind may show a folder at another path (a
    kind that cannot runs everything at its host path). ``python``: the interpreter to name."""

    kind: str
    remaps: bool
    python: str

    @abstractmethod
    def run(
        self,
        command: Sequence[str],
        *,
        workdir: str,
        binds: Sequence[Bind] = (),
        env: Mapping[str, str] | None = None,
        timeout_s: float,
        limits: Limits = NO_LIMITS,
    ) -> RunResult:
        """Run ``command`` in ``workdir``; raises SandboxError if the sandbox cannot start."""

    def prepare(
        self,
        command: Sequence[str],
        *,
        workdir: str,
        name: str,
        binds: Sequence[Bind] = (),
        env: Mapping[str, str] | None = None,
        limits: Limits = NO_LIMITS,
        route: ProxyRoute | None = None,
    ) -> Prepared:
        """The command line that starts ``command`` in this sandbox and lets it run (a harness,
        say), reaching only ``route`` (when given) over the network. ``name`` is unique per
        process (an execution id made safe). Raises SandboxError if this kind cannot."""
        raise SandboxError(f"the {self.kind} sandbox cannot start long-running processes")


# The one GYRE_ variable a sandboxed command may hold: an execution's own proxy key, under the
# name Codex's provider block reads it from (it opens nothing but that execution's proxy calls).
EXECUTION_KEY_ENV = "GYRE_API_KEY"


def minimal_env(home: str, declared: Mapping[str, str] | None) -> dict[str, str]:
    """PATH, HOME, LANG and TMPDIR, then what the caller ``declared``; never a GYRE_ variable
    but an execution's proxy key (``EXECUTION_KEY_ENV``)."""
    declared = dict(declared or {})
    settings = (k for k in declared if k.upper().startswith("GYRE_") and k != EXECUTION_KEY_ENV)
    if run_settings := sorted(settings):
        raise SandboxError(f"env: a sandboxed command may not be given gyre's own settings: {run_settings}")
    return {"PATH": DEFAULT_PATH, "HOME": home, "LANG": DEFAULT_LANG, "TMPDIR": "/tmp"} | declared


def run_group(
    argv: Sequence[str], *, cwd: Path | None, env: Mapping[str, str], timeout_s: float
) -> RunResult:
    """Run ``argv`` in a process group of its own; on timeout kill the whole group."""
    if timeout_s <= 0:
        raise SandboxError(f"timeout_s must be positive, got {timeout_s}")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]!r}: {exc.strerror}") from exc
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:  # something outside the group holds the pipes
            proc.kill()
            out, err = b"", b""
    finally:
        if proc.poll() is None:
            _kill_group(proc.pid)
            proc.wait()
    _kill_group(proc.pid)  # whatever the command left running in its group goes with it
    return RunResult(
        exit_code=proc.returncode,
        stdout=out.decode(errors="replace")[-TAIL_CHARS:],
        stderr=err.decode(errors="replace")[-TAIL_CHARS:],
        seconds=time.monotonic() - started,
        timed_out=timed_out,
    )


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
