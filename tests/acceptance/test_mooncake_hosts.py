"""Mooncake Transfer Engine across machines, on hosts made of network namespaces.

Each host reaches the others only at their addresses on the test's bridge; its own 127.0.0.1 is
its own. So a Transfer Engine that says its memory is at 127.0.0.1 (the default before machines
advertised their addresses) sends a reader on another host to that host's own loopback, and the
read fails. Here:

- KV-cache migration: ``gyre engine serve --host 0.0.0.0 --advertise-host <B>`` on host B pins a
  request and exposes its cache; the engine on host C reads it one-sidedly from B's memory.
- Trainer weights: a core's snapshot transport on host B (``make_transport("mooncake", ...,
  host=<B>)``, as a cell process builds it from ``CellConfig.transport_host``) exposes its flat
  weights; a satellite on host C pulls them exactly.

Needs root, ``ip`` and Mooncake (``tests/real_servers.py``); GYRE_TEST_SKIP_NETNS=1 or
GYRE_TEST_SKIP_MOONCAKE=1 skips them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from gyre_proxy.engines import EngineClient, EngineClientConfig, FinishKind
from gyre_proxy.engines.refengine.decode_loop import PIN_ABORT_MESSAGE
from tests import netns
from tests.integration.proxy.kv_engines import start_streaming
from tests.real_servers import mooncake_missing, unavailable

pytestmark = [pytest.mark.acceptance]

PROMPT = [int(x) for x in np.random.default_rng(5).integers(3, 250, size=96)]


def _require_mooncake() -> None:
    if (missing := mooncake_missing()) is not None:
        unavailable("mooncake", missing)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}


@contextmanager
def _engine_on(host: netns.Host, port: int, log: Path) -> Iterator[str]:
    """``gyre engine serve`` on ``host``, listening on every address and advertising the host's
    own; yields the URL the test's namespace calls it at."""
    argv = [sys.executable, "-m", "gyre_tools.cli", "engine", "serve", "--host", "0.0.0.0",
            "--port", str(port), "--advertise-host", host.address, "--seed", "0"]  # fmt: skip
    url = f"http://{host.address}:{port}"
    with (
        log.open("w") as out,
        subprocess.Popen(host.command(argv), env=_env(), stdout=out, stderr=out) as process,
    ):
        try:
            deadline = time.monotonic() + 120
            while True:
                assert process.poll() is None, (
                    f"the engine on {host.namespace} ended: {log.read_text()[-2000:]}"
                )
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"the engine on {host.namespace} did not answer"
                time.sleep(0.5)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def test_a_kv_cache_moves_between_engines_on_two_hosts_over_mooncake(
    hosts: netns.Network, tmp_path: Path
) -> None:
    _require_mooncake()
    b, c = hosts.add_host("b"), hosts.add_host("c")
    with _engine_on(b, 30111, tmp_path / "b.log") as b_url, _engine_on(c, 30112, tmp_path / "c.log") as c_url:

        async def move() -> None:
            source = EngineClient(EngineClientConfig(b_url, timeout_s=120))
            destination = EngineClient(EngineClientConfig(c_url, timeout_s=120))
            try:
                streaming = await start_streaming(source, "hosts-1", PROMPT, 8)
                pinned = await source.pin_and_abort("hosts-1")
                assert (await streaming.task, streaming.message) == (FinishKind.ABORT, [PIN_ABORT_MESSAGE])
                exposed = await source.expose_kv("hosts-1")
                # B's Transfer Engine names the address C reaches B at, not B's loopback.
                assert exposed.segment.startswith(f"{b.address}:"), exposed.segment
                imported = await destination.pull_kv(exposed)
                assert (imported.key, imported.num_tokens) == ("hosts-1", pinned.num_tokens)
                assert imported.num_tokens == len(PROMPT) + len(streaming.tokens)
                status = await destination.kv_status()
                assert status.imported_entries == 1, status
                await source.release_kv("hosts-1")
            finally:
                await source.aclose()
                await destination.aclose()

        asyncio.run(move())


CORE = """
import json, sys, time
import redis, torch
from gyre_train.cells import QueueConfig, RedisBatchBoard, make_transport
url, prefix, address = sys.argv[1:4]
client = redis.Redis.from_url(url)
board = RedisBatchBoard(client, QueueConfig(prefix))
transport = make_transport("mooncake", board, 0, host=address)
transport.expose(torch.arange(4096, dtype=torch.float32) * 0.5, 7)
print(json.dumps({"segment": transport.segment}), flush=True)
deadline = time.monotonic() + 90
while client.get(prefix + ":pulled") is None and time.monotonic() < deadline:
    time.sleep(0.05)
transport.close()
"""

SATELLITE = """
import json, sys
import redis, torch
from gyre_train.cells import QueueConfig, RedisBatchBoard, make_transport
url, prefix, address = sys.argv[1:4]
client = redis.Redis.from_url(url)
board = RedisBatchBoard(client, QueueConfig(prefix))
transport = make_transport("mooncake", board, 1, host=address)
into = torch.zeros(4096, dtype=torch.float32)
try:
    transport.pull(into, 7, timeout_s=30)
    print(json.dumps({"equal": bool(torch.equal(into, torch.arange(4096, dtype=torch.float32) * 0.5))}))
except Exception as exc:
    print(json.dumps({"error": str(exc)}))
finally:
    client.set(prefix + ":pulled", 1)
    transport.close()
"""


def test_a_satellite_on_another_host_pulls_the_cores_weights_over_mooncake(
    hosts: netns.Network, hosts_redis: str
) -> None:
    _require_mooncake()
    b, c = hosts.add_host("b"), hosts.add_host("c")
    prefix = f"gyre:mooncake-hosts:{time.monotonic_ns()}"
    argv = b.command([sys.executable, "-c", CORE, hosts_redis, prefix, b.address])
    with subprocess.Popen(
        argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as core:
        try:
            assert core.stdout is not None and core.stderr is not None
            line = core.stdout.readline()
            assert line, f"the core on host B ended: {core.stderr.read()[-2000:]}"
            segment = json.loads(line)["segment"]
            assert segment.startswith(f"{b.address}:"), segment
            satellite = subprocess.run(
                c.command([sys.executable, "-c", SATELLITE, hosts_redis, prefix, c.address]),
                env=_env(), capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert satellite.returncode == 0, satellite.stderr[-2000:]
            assert json.loads(satellite.stdout.strip().splitlines()[-1]) == {"equal": True}, satellite.stdout
        finally:
            try:
                core.wait(60)
            except subprocess.TimeoutExpired:
                core.kill()
