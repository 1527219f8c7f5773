"""A rollout engine listening on every address registers the address other hosts reach it at,
and another host (a network namespace) calls it there; the loopback address it would otherwise
have registered is not reachable from that host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gyre_store import EngineRegistered, InMemoryEventLog
from gyre_train.backends import new_policy
from gyre_train.cells.rollout import RolloutEngine, RolloutEngineConfig, _ReferenceServing
from gyre_train.exceptions import InvalidConfigError
from tests import netns

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FETCH = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)"


def _config(initial: Path, tmp_path: Path, **where: str) -> RolloutEngineConfig:
    return RolloutEngineConfig(
        run_id="run", engine="run:pool-0", cell_index=-1, capacity=2, database_url="",
        initial_model=initial, publish_dir=tmp_path / "policies", max_context=512, **where,  # type: ignore[arg-type]
    )  # fmt: skip


def test_an_engine_on_every_address_registers_the_advertised_one(tmp_path: Path) -> None:
    initial = tmp_path / "initial"
    new_policy(0).save_pretrained(str(initial))  # the demo's untrained policy (bundled vocabulary)
    with pytest.raises(InvalidConfigError, match="advertise host"):
        _config(initial, tmp_path, host="0.0.0.0")
    with netns.network() as net:
        other = net.add_host("b")
        log = InMemoryEventLog()
        engine = RolloutEngine(_config(initial, tmp_path, host="0.0.0.0", advertise_host=net.gateway), log)
        engine.start()
        try:
            [registered] = [r.event for r in log.read(0) if isinstance(r.event, EngineRegistered)]
            assert engine.base_url is not None
            port = urlsplit(engine.base_url).port
            assert registered.url == engine.url == f"http://{net.gateway}:{port}"
            # Its Mooncake Transfer Engine (KV migration) names the same address, and the log says so.
            assert registered.kv_transfer_host == net.gateway
            assert isinstance(engine.serving, _ReferenceServing)
            assert engine.serving.server.engine.config.mooncake.host == net.gateway
            called = subprocess.run(
                other.command([sys.executable, "-c", FETCH, f"{registered.url}/get_model_info"]),
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert called.returncode == 0 and called.stdout.strip() == "200", called.stderr
            # What a loopback registration would give the other host: its own loopback, where
            # nothing listens.
            loopback = subprocess.run(
                other.command([sys.executable, "-c", FETCH, f"http://127.0.0.1:{port}/get_model_info"]),
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert loopback.returncode != 0 and "Connection refused" in loopback.stderr, loopback.stderr
        finally:
            engine.stop()
