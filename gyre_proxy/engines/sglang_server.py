"""A real SGLang server as a child process: started on a model folder, waited for until healthy,
asked what it is doing, and stopped with everything it spawned.

The command that starts it is given, not built here: ``tools/sglang_setup.sh serve`` knows
where SGLang's environment lives and the CPU workarounds it needs, and is the one place that
says so. The server runs in a process group of its own (SGLang forks a scheduler and a
detokenizer), so stopping it ends the whole group, and it gets SIGTERM if the process that
started it dies (Linux). It knows nothing of runs, logs or registration (``gyre_train``'s
rollout engines do that).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from gyre_proxy.exceptions import EngineUnavailable
from gyre_proxy.hosting import free_port


@dataclass(frozen=True, slots=True)
class SGLangServerConfig:
    """How to start one SGLang server (picklable).

    ``command`` is run as ``[*command, model_dir, port, *options]``; ``options`` are
    ``python -m sglang.launch_server`` options added after the command's own defaults (a repeated
    option overrides: argparse keeps the last). ``weight_version`` is the version the server
    reports before any update (``--weight-version``); gyre's proxy records no policy version
    for SGLang's own ``"default"``.
    """

    command: tuple[str, ...]
    model_dir: Path
    weight_version: str = "0"
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port
    context_length: int = 4096
    max_total_tokens: int = 8192  # the KV pool, which SGLang would otherwise size from the machine
    start_timeout_s: float = 600.0
    stop_grace_s: float = 10.0
    log_path: Path | None = None  # the server's stdout and stderr (None: discarded)
    options: tuple[str, ...] = ()


class SGLangServer:
    """One SGLang server process; a context manager (enter starts and waits, exit stops).

    Raises ``EngineUnavailable`` on enter when the process exits while starting or is not
    healthy within ``start_timeout_s`` (the end of its log in the message).
    """

    def __init__(self, config: SGLangServerConfig) -> None:
        self.config = config
        self.port = config.port or free_port(config.host)
        self.base_url = f"http://{config.host}:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None  # seconds from launch to healthy

    def argv(self) -> list[str]:
        c = self.config
        return [
            *c.command, str(c.model_dir), str(self.port),
            "--host", c.host,
            "--context-length", str(c.context_length),
            "--max-total-tokens", str(max(c.max_total_tokens, c.context_length)),
            "--weight-version", c.weight_version,
            *c.options,
        ]  # fmt: skip

    def __enter__(self) -> Self:
        c = self.config
        began = time.monotonic()
        out: IO[bytes] | int = subprocess.DEVNULL
        if c.log_path is not None:
            c.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = c.log_path.open("ab")
        try:
            # Started from the one launcher thread, which lives as long as this process: the
            # parent-death signal follows the thread that forked, not the process.
            self.process = _LAUNCHER.submit(
                subprocess.Popen,
                self.argv(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() ends SGLang's children too
                preexec_fn=_term_with_parent,
            ).result()
        finally:
            if not isinstance(out, int):
                out.close()
        try:
            self._wait_healthy(began + c.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - began
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_healthy(self, deadline: float) -> None:
        assert self.process is not None  # started by __enter__
        with httpx.Client(timeout=5.0) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise EngineUnavailable(
                        f"SGLang exited {code} while starting on {self.base_url}{self._log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise EngineUnavailable(
                        f"SGLang was not healthy on {self.base_url} after "
                        f"{self.config.start_timeout_s:.0f} s{self._log_tail()}"
                    )
                time.sleep(0.5)

    def _log_tail(self, lines: int = 12) -> str:
        path = self.config.log_path
        if path is None or not path.is_file():
            return ""
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        return f" (log {path}):\n" + "\n".join(tail)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def in_flight(self) -> int:
        """Requests the server is running or has queued (``/v1/loads``); 0 once it is gone."""
        if not self.alive():
            return 0
        try:
            answer = httpx.get(f"{self.base_url}/v1/loads", params={"include": "core"}, timeout=5.0)
            answer.raise_for_status()
            loads = answer.json().get("loads", [])
            return sum(int(x.get("num_running_reqs", 0)) + int(x.get("num_waiting_reqs", 0)) for x in loads)
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            return 1 if self.alive() else 0  # alive but not answering: counted busy

    def abort_all(self) -> None:
        """Abort every request in flight (``/abort_request`` with ``abort_all``)."""
        if self.alive():
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    f"{self.base_url}/abort_request", json={"rid": "", "abort_all": True}, timeout=10.0
                )

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after the grace."""
        process, self.process = self.process, None
        if process is None:
            return
        pgid = process.pid  # start_new_session: the server leads its own group
        _signal_group(pgid, signal.SIGTERM)
        try:
            process.wait(self.config.stop_grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            process.wait(10)
        # SGLang's scheduler and detokenizer may outlive the launcher by a moment.
        _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


_LAUNCHER = ThreadPoolExecutor(1, thread_name_prefix="sglang-launcher")


def _term_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that forked it ends (Linux), so a
    killed node agent leaves no SGLang server behind. Linux ties the signal to the forking
    thread, so servers are forked from ``_LAUNCHER``, whose thread ends only with the process."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
