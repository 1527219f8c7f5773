"""deploy/grafana/gyre.json against the exporters: every metric a panel queries is one the
proxy, the reference engine, the controller or a trainer cell exports, and every metric they
export is shown."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngine, ReferenceEngineConfig
from gyre_proxy.engines.refengine.metrics import engine_registry
from gyre_proxy.service import ProxyMetrics
from gyre_sched.live import Controller, ControllerCollector
from gyre_sched.testing import RecordingSink
from gyre_store import InMemoryEventLog
from gyre_train.cells import CellMetrics
from tests.unit.sched.helpers import tiny

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gyre.json"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}


def exported(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Each metric family of ``registry`` -> the series names a query can use."""
    return {f.name: {f.name + s for s in SUFFIXES[f.type]} for f in registry.collect()}


def queried() -> set[str]:
    names: set[str] = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            names |= set(re.findall(r"\bgyre_[a-z_]+\b", target["expr"]))
    return names


def test_the_dashboard_queries_exactly_what_the_exporters_export() -> None:
    controller_registry = CollectorRegistry()
    controller_registry.register(
        ControllerCollector(Controller(InMemoryEventLog(), tiny(), RecordingSink(), "r"))
    )
    config = ReferenceEngineConfig(source=ModelSource(tokenizer="byte", seed=0), max_context=64)
    families = {
        **exported(ProxyMetrics().registry),
        **exported(engine_registry(ReferenceEngine(config))),
        **exported(controller_registry),
        **exported(CellMetrics(0).registry),
    }
    assert {name.split("_")[1] for name in families} == {"proxy", "engine", "controller", "trainer"}
    series = set().union(*families.values())
    used = queried()
    assert used, "the dashboard queries no gyre metric"
    assert used <= series, f"queried but not exported: {sorted(used - series)}"
    shown = {family for family, names in families.items() if names & used}
    assert shown == set(families), f"exported but on no panel: {sorted(set(families) - shown)}"
