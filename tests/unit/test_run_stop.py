"""gyre run stops its processes in waves: the launcher has ended its harnesses before the proxy
is asked to stop, so no harness still running loses its model API first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gyre_store.testing import InMemoryEventLog
from gyre_tools.run import LiveRun, stop_waves
from gyre_tools.run_config import DEMO

# A process that, on SIGTERM, writes when the signal came, takes a while to finish, and writes
# when it is done (a launcher killing its harnesses; a proxy closing its server).
CHILD = """
import signal, sys, time
out = open(sys.argv[1], "a")
def stop(*_):
    out.write(f"term {sys.argv[2]} {time.time()}\\n"); out.flush()
    time.sleep(float(sys.argv[3]))
    out.write(f"done {sys.argv[2]} {time.time()}\\n"); out.flush()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
out.write(f"up {sys.argv[2]}\\n"); out.flush()
while True:
    time.sleep(0.05)
"""


def test_the_waves_put_the_launcher_before_the_proxy() -> None:
    names = ["node", "node-1", "proxy", "launcher", "evaluator", "controller"]
    assert stop_waves(names) == [["controller"], ["launcher"], ["evaluator"], ["node", "node-1", "proxy"]]
    assert stop_waves(["proxy"]) == [["proxy"]]


def test_the_launcher_has_ended_before_the_proxy_hears_sigterm(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    run = LiveRun(InMemoryEventLog(), DEMO, tmp_path, None)
    for name, linger in (("node", 0.0), ("proxy", 0.0), ("launcher", 0.6), ("evaluator", 0.0)):
        run.children[name] = subprocess.Popen([sys.executable, "-c", CHILD, str(trace), name, str(linger)])
    for _ in range(200):  # every child has its handler installed
        if trace.exists() and trace.read_text().count("up ") == 4:
            break
        subprocess.run(["sleep", "0.05"], check=True)
    run.stop()
    assert all(child.returncode == 0 for child in run.children.values())
    times = {
        (kind, name): float(at)
        for kind, name, at in (
            line.split() for line in trace.read_text().splitlines() if not line.startswith("up")
        )
    }
    assert times[("done", "launcher")] <= times[("term", "proxy")]
    assert times[("done", "launcher")] <= times[("term", "node")]
    assert times[("done", "evaluator")] <= times[("term", "proxy")]
