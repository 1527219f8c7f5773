"""The proxy moves a rerouted request's KV cache over Mooncake where both engines have it, else
over HTTP; the ``request.moved`` event names the transport, and the source holds nothing once
the move is over.

The scheduler moves an execution while its answer streams, as in ``test_reroute_in_flight``.
The cases that need Mooncake fail when it does not import, unless GYRE_TEST_SKIP_MOONCAKE=1.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gyre_proxy.engines.refengine import MooncakeConfig, ReferenceEngineServer
from gyre_store import InMemoryEventLog, MovePath, RequestMoved
from tests.integration.proxy.moves import move_mid_answer, scripted_engines
from tests.real_servers import mooncake_missing, unavailable

pytestmark = pytest.mark.integration

RUN = "run-move-mc"


def _kv_status(server: ReferenceEngineServer) -> dict[str, object]:
    answer: dict[str, object] = httpx.get(server.base_url + "/gyre/kv/status").json()
    return answer


@pytest.mark.parametrize(
    ("source", "destination", "transport"),
    [(True, True, "mooncake"), (True, False, "http"), (False, True, "http")],
    ids=["both-mooncake", "destination-without", "source-without"],
)
def test_a_moved_request_takes_its_kv_over_mooncake_where_both_engines_can(
    tmp_path: Path, source: bool, destination: bool, transport: str
) -> None:
    if source and (missing := mooncake_missing()) is not None:
        unavailable("mooncake", missing)
    # Identical scripted engines; only whether each has Mooncake differs.
    engines = (
        {"mooncake": MooncakeConfig(enabled=source)},
        {"mooncake": MooncakeConfig(enabled=destination)},
    )
    with scripted_engines(tmp_path, *engines) as (cell, pool):
        log = InMemoryEventLog()
        answer = move_mid_answer(log, RUN, cell, pool)
        assert answer.stop_reason == "end_turn"
        assert (answer.moved, answer.kv_migrated) == (1, 1)
        [moved] = [r.event for r in log.read(0) if isinstance(r.event, RequestMoved)]
        assert moved.path is MovePath.KV_MIGRATION and moved.kv_tokens > 0
        if transport == "mooncake":
            assert moved.detail == "mooncake"
        else:
            # Refused typed by whichever end has no Mooncake, then carried over HTTP.
            assert (
                moved.detail.startswith("http (not over mooncake: ") and "off in this engine" in moved.detail
            )
        # The source released its pin, and with it the exposed payload, once the destination
        # had imported it; the destination keeps it as a prefix-cache entry.
        held = _kv_status(cell)
        assert (held["pinned_entries"], held["exposed_entries"], held["exposed_bytes"]) == (0, 0, 0)
        assert _kv_status(pool)["imported_entries"] == 1
