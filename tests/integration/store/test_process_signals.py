"""A gyre process asked where it is (SIGUSR1) writes its threads' stacks to its log and goes on:
on a real command, `gyre events tail --follow`, reading a real database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.acceptance.conftest import ROOT


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its SigCgt mask, Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def test_sigusr1_dumps_every_thread_and_the_process_goes_on(database_url: str, tmp_path: Path) -> None:
    log = tmp_path / "tail.log"
    env = {**os.environ, "GYRE_DATABASE_URL": database_url}
    with log.open("wb") as out:
        tail = subprocess.Popen(
            [sys.executable, "-m", "gyre_tools.cli", "events", "tail", "--follow"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not _catches(tail.pid, signal.SIGUSR1):  # before that, SIGUSR1 would end it
                assert tail.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            # Asked every 2 s until a dump shows the main thread in the follow loop (the first
            # may come while it still imports).
            while "tools/events.py" not in (dump := log.read_text()):
                assert tail.poll() is None, f"SIGUSR1 ended the process\n{dump}"
                assert time.monotonic() < deadline, dump
                tail.send_signal(signal.SIGUSR1)
                time.sleep(2)
            assert "Current thread" in dump and "(most recent call first)" in dump, dump
            time.sleep(0.5)
            assert tail.poll() is None, "SIGUSR1 ended the process"
        finally:
            tail.kill()
            tail.wait(10)
