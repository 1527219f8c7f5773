"""One event vocabulary: every type is read back typed by a fresh process that imports only
gyre_store and the package that owns the type, never by accident of import order."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec

from gyre_sched import SCHED_EVENT_TYPES
from gyre_store import REGISTRY, PostgresEventLog, StoreConfig
from tests.examples import example_events

# Reads the whole log in a fresh interpreter after importing only the modules named in
# argv[2:], and prints what each event decoded to: its class's event_type, or "opaque".
READER = """
import importlib, json, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
from gyre_store import OpaqueEvent, PostgresEventLog, StoreConfig
with PostgresEventLog(StoreConfig(sys.argv[1])) as log:
    out = []
    for rec in log.read():
        ev = rec.event
        if isinstance(ev, OpaqueEvent):
            out.append([ev.type_name, "opaque"])
        else:
            import msgspec
            out.append([type(ev).event_type, msgspec.json.encode(ev).decode()])
print(json.dumps(out))
"""


def _read_in_fresh_process(url: str, *modules: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", READER, url, *modules], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_every_event_type_reads_back_typed_with_only_its_owning_package(database_url: str) -> None:
    written = example_events(REGISTRY)
    names = {new.event.event_type for new in written}
    sched_names = {name for name, _ in SCHED_EVENT_TYPES}
    assert sched_names <= names  # this process imported gyre_sched, which registered them
    assert {"model_call.recorded", "evaluation.recorded", "train.update", "group.ready"} <= names
    with PostgresEventLog(StoreConfig(database_url)) as log:
        log.append(written)
    bodies = {new.event.event_type: msgspec.json.encode(new.event).decode() for new in written}

    store_only = _read_in_fresh_process(database_url)  # `import gyre_store` and nothing else
    assert set(store_only) == names
    for name in names - sched_names:
        assert store_only[name] == bodies[name], f"{name} did not read back typed with gyre_store alone"
    # The scheduler's own types need their owner: without it they are opaque, never misread.
    assert {store_only[name] for name in sched_names} == {"opaque"}

    with_owner = _read_in_fresh_process(database_url, "gyre_sched")
    assert with_owner == bodies
