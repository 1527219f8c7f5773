"""The ``local`` sandbox: a subprocess on the host, in the workspace folder, in a process group
of its own, with a minimal environment (PATH, HOME = the workspace, LANG, TMPDIR; never the
parent's variables) and the limits as rlimits. It isolates nothing else: the command sees the
host's files and network, and as root no process limit applies; a process that leaves its group
(``setsid``) outlives it. Binds cannot move a folder, so every path is the host's own.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import (
    NO_LIMITS,
    Bind,
    Limits,
    Prepared,
    ProxyRoute,
    RunResult,
    Sandbox,
    minimal_env,
    run_group,
)


class LocalSandbox(Sandbox):
    """Runs commands on the host (see the module docstring for what that does not block)."""

    kind = "local"
    remaps = False
    python = sys.executable

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
        folder = _check(command, workdir, binds)
        return run_group(
            [*limits.prlimit(), *command], cwd=folder, env=minimal_env(str(folder), env), timeout_s=timeout_s
        )

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
        """``command`` on the host in ``workdir`` (whatever the caller's working directory),
        with ``run``'s environment and limits. ``route`` is ignored: the host's network is the
        command's, the proxy's port included."""
        folder = _check(command, workdir, binds)
        argv = ["/usr/bin/env", f"--chdir={folder}", "--", *limits.prlimit(), *command]
        return Prepared(tuple(argv), minimal_env(str(folder), env))


def _check(command: Sequence[str], workdir: str, binds: Sequence[Bind]) -> Path:
    """The working folder; raises SandboxError for an empty command, a missing folder or a bind
    that would move a folder."""
    if not command:
        raise SandboxError("command: empty")
    for bind in binds:
        if Path(bind.target) != bind.source:
            raise SandboxError(
                f"binds: local cannot show {bind.source} at {bind.target}; use the bwrap sandbox"
            )
    folder = Path(workdir)
    if not folder.is_dir():
        raise SandboxError(f"workdir: {workdir} is not a folder")
    return folder
