"""Where a node's engines and the proxy listen, and the addresses they register for other machines."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre_store import InMemoryEventLog
from gyre_tools.cli import build_parser
from gyre_tools.node_plan import node_plan
from gyre_tools.proxy import register_proxy
from gyre_tools.run_config import DEMO
from gyre_tools.serve import proxy_url
from gyre_train.cells.rollout import RolloutEngineConfig
from gyre_train.exceptions import InvalidConfigError


def _engine(**where: str | None) -> RolloutEngineConfig:
    return RolloutEngineConfig(
        run_id="r", engine="r:pool-0", cell_index=-1, capacity=1, database_url="",
        initial_model=Path("init"), publish_dir=Path("policies"), **where,  # type: ignore[arg-type]
    )  # fmt: skip


def test_the_registered_url_is_the_advertised_host_at_the_servers_port() -> None:
    assert _engine().advertised("http://127.0.0.1:4000") == "http://127.0.0.1:4000"
    assert _engine(host="0.0.0.0", advertise_host="node-b.cluster").advertised("http://0.0.0.0:4000") == (
        "http://node-b.cluster:4000"
    )
    assert (
        _engine(host="::", advertise_host="fd00::2").advertised("http://[::]:4000") == "http://[fd00::2]:4000"
    )


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", ""])
def test_listening_on_every_address_needs_an_advertise_host(wildcard: str) -> None:
    with pytest.raises(InvalidConfigError, match="advertise host"):
        _engine(host=wildcard)


def test_node_serve_passes_its_addresses_to_every_engine_it_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYRE_NODE_ADVERTISE_HOST", "10.0.0.5")
    args = build_parser().parse_args(["node", "serve", "--run", "r", "--host", "0.0.0.0"])
    assert (args.host, args.advertise_host) == ("0.0.0.0", "10.0.0.5")
    plan = node_plan(
        InMemoryEventLog(), DEMO, run_id="r", database_url="", redis_url="", engines="2",
        engine_offset=3, trainers="none", dist_port=0, host=args.host, advertise_host=args.advertise_host,
    )  # fmt: skip
    assert [(e.engine, e.host, e.advertise_host) for e in plan.engines] == [
        ("r:pool-3", "0.0.0.0", "10.0.0.5"),
        ("r:pool-4", "0.0.0.0", "10.0.0.5"),
    ]
    assert build_parser().parse_args(["node", "serve", "--run", "r"]).host == "127.0.0.1"


def test_a_launcher_not_told_the_proxy_takes_the_newest_registration_or_says_why_not() -> None:
    log = InMemoryEventLog()
    with pytest.raises(SystemExit, match="registered no URL"):
        proxy_url(log, "r", None, wait_s=0)
    for url in ("http://a:1", "http://b:2"):
        register_proxy(log, "r", url)
    register_proxy(log, "other", "http://c:3")
    assert proxy_url(log, "r", None, wait_s=0) == "http://b:2"
    assert proxy_url(log, "r", "http://given:4") == "http://given:4"
