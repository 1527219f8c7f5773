"""`gyre proxy serve --run` listening on every address registers the URL other machines reach
it at; another host (a network namespace) calls the proxy there, and a launcher not told the
proxy's URL takes that one from the log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gyre_proxy.engines import free_port
from gyre_store import PostgresEventLog, ProxyRegistered, StoreConfig, StreamId
from gyre_tools.serve import proxy_url
from tests import netns

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
RUN = "address-run"
FETCH = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)"


def _serve(database_url: str, tmp_path: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "gyre_tools.cli", "proxy", "serve", "--run", RUN,
            "--spool-dir", str(tmp_path / "spool"), *options]  # fmt: skip


def test_the_proxy_registers_its_advertised_url_and_another_host_calls_it(
    database_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env["GYRE_DATABASE_URL"] = database_url
    refused = subprocess.run(
        _serve(database_url, tmp_path, "--host", "0.0.0.0", "--port", str(free_port())),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0 and "--advertise-host" in refused.stderr, refused.stderr
    port = free_port()
    with netns.network() as net, (tmp_path / "proxy.log").open("ab") as out:
        other = net.add_host("b")
        proxy = subprocess.Popen(
            _serve(database_url, tmp_path, "--host", "0.0.0.0", "--port", str(port),
                   "--advertise-host", net.gateway),
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while True:
                assert proxy.poll() is None, (tmp_path / "proxy.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (tmp_path / "proxy.log").read_text()[-3000:]
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            advertised = f"http://{net.gateway}:{port}"
            with PostgresEventLog(StoreConfig(database_url)) as log:
                while not (events := [r.event for r in log.read_stream(StreamId("proxy", RUN))]):
                    assert time.monotonic() < deadline, (tmp_path / "proxy.log").read_text()[-3000:]
                    time.sleep(0.2)  # it registers once it serves
                assert events == [ProxyRegistered(run_id=RUN, url=advertised)]
                assert proxy_url(log, RUN, None, wait_s=0) == advertised  # a launcher's default
                assert proxy_url(log, RUN, "http://given:1") == "http://given:1"
            called = subprocess.run(
                other.command([sys.executable, "-c", FETCH, f"{advertised}/health"]),
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert called.returncode == 0 and called.stdout.strip() == "200", called.stderr
        finally:
            proxy.terminate()
            proxy.wait(60)
