"""Starting a harness process, as a program or, for a Python harness, forked ready-imported.

A harness is a program (``LaunchSpec.argv``). A Python harness that names its entry point
(``LaunchSpec.entry``: module and function, called with ``argv[3:]`` as ``python -m`` would)
is the same program, but its process can fork from a server that imported it once, with the
modules the spec names to preload: the built-in agent's SDK takes two to three seconds of CPU
to import, paid per execution otherwise. The fork server starts with the first forked harness
and keeps the modules it preloaded then (one launcher runs one harness). It imports them under
the launcher's environment and, on Python 3.11, from the default ``sys.path`` of a new
interpreter (with ``PYTHONPATH``), and skips a module it cannot import without a word: the
harness then imports it itself, as a program would.
Either way the harness gets its own process group (a budget kill takes its children too),
its working directory, only the environment the launcher gives it, its stdin from the
prompt, and its output in the execution's log.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.process
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Protocol

from gyre_proxy.harness import LaunchSpec


class HarnessProcess(Protocol):
    """A started harness: its pid (and process group), its exit status once it ended."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float) -> int:
        """The exit status; raises subprocess.TimeoutExpired if it still runs after ``timeout``."""
        ...


class _Forked:
    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        assert self._process.pid is not None  # started
        return self._process.pid

    def poll(self) -> int | None:
        if self._process.is_alive():
            return None
        return self._process.exitcode

    def wait(self, timeout: float) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"harness {self.pid}", timeout)
        return self._process.exitcode


class _Program:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    def poll(self) -> int | None:
        return self._process.poll()

    def wait(self, timeout: float) -> int:
        return self._process.wait(timeout)


class Starter:
    """Starts harness processes; entries run forked from a server that preloaded them."""

    def __init__(self, *, fork_entries: bool = True) -> None:
        self._fork = fork_entries
        self._context: multiprocessing.context.BaseContext | None = None
        self._preloaded: set[str] = set()

    def start(self, spec: LaunchSpec, *, cwd: Path, env: dict[str, str], log: Path) -> HarnessProcess:
        """Raises OSError when the program cannot be started."""
        if spec.entry is not None and self._fork:
            return self._start_forked(spec, cwd, env, log)
        with log.open("ab") as out:
            process = subprocess.Popen(
                spec.argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a budget kill takes its children too
            )
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(spec.stdin.encode())
        process.stdin.close()
        return _Program(process)

    def _start_forked(self, spec: LaunchSpec, cwd: Path, env: dict[str, str], log: Path) -> HarnessProcess:
        assert spec.entry is not None
        module, function = spec.entry
        if self._context is None:
            self._preloaded.update((module, *spec.preload))
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(sorted(self._preloaded))
            self._context = context
        with tempfile.NamedTemporaryFile("w", delete=False, dir=log.parent, suffix=".stdin") as stdin:
            stdin.write(spec.stdin)
        process: multiprocessing.process.BaseProcess = self._context.Process(  # type: ignore[attr-defined]
            target=run_entry,
            args=(module, function, list(spec.argv[3:]), str(cwd), env, stdin.name, str(log)),
            name="gyre-harness",
        )
        process.start()
        return _Forked(process)


def run_entry(
    module: str, function: str, args: list[str], cwd: str, env: dict[str, str], stdin: str, log: str
) -> None:
    """The forked harness process: become the program its entry point is, then exit with its status."""
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.dup2(os.open(stdin, os.O_RDONLY), 0)
    os.unlink(stdin)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the process's own stdin, for its lifetime)
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    code = getattr(importlib.import_module(module), function)(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))
