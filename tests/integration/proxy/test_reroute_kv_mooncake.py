"""The proxy moves a rerouted request's KV cache over Mooncake where both engines have it, else
over HTTP; the ``request.moved`` event names the transport, and the source holds nothing once
the move is over.

The scheduler moves an execution while its answer streams, as in ``test_reroute_in_flight``.
The cases that need Mooncake fail when it does not import, unless GYRE_TEST_SKIP_MOONCAKE=1.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from gyre_proxy.engines.refengine import (
    ModelSource,
    MooncakeConfig,
    ReferenceEngineConfig,
    ReferenceEngineServer,
)
from gyre_proxy.service import ProxyConfig, ProxyService, issue_key
from gyre_store import (
    EngineRegistered,
    EngineRoutingChanged,
    ExecutionRerouted,
    ExecutionStarted,
    InMemoryEventLog,
    MovePath,
    NewEvent,
    RequestMoved,
)
from tests.real_servers import unavailable

pytestmark = pytest.mark.integration

RUN = "run-move-mc"
LONG = "The files are listed above. " + "Here is a long explanation of every one of them. " * 40


def _mooncake_missing() -> str | None:
    """Why Mooncake Transfer Engine cannot be imported here, or None when it can."""
    if importlib.util.find_spec("mooncake") is None:
        return "MOONCAKE NOT INSTALLED: pip install '.[mooncake]' (and apt-get install libibverbs1)"
    try:
        importlib.import_module("mooncake.engine")
    except (ImportError, OSError) as exc:  # the wheel needs libibverbs1 from the OS
        return f"MOONCAKE DOES NOT IMPORT ({exc}): apt-get install libibverbs1 to test it"
    return None


@contextlib.contextmanager
def _engines(tmp_path: Path, *, source: bool, destination: bool) -> Iterator[list[ReferenceEngineServer]]:
    # Identical scripted engines (same seed, same script), so the answer continues on either;
    # only whether each has Mooncake differs.
    with contextlib.ExitStack() as stack:
        servers = []
        for i, enabled in enumerate((source, destination)):
            folder = tmp_path / f"e{i}"
            folder.mkdir()
            (folder / "script.json").write_text(json.dumps({"outputs": [LONG, LONG], "rule": "in_order"}))
            cfg = ReferenceEngineConfig(
                source=ModelSource(tokenizer="qwen", seed=0),
                max_context=8192,
                script=folder / "script.json",
                mooncake=MooncakeConfig(enabled=enabled),
            )
            servers.append(stack.enter_context(ReferenceEngineServer(cfg)))
        yield servers


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
    if source and (missing := _mooncake_missing()) is not None:
        unavailable("mooncake", missing)
    with _engines(tmp_path, source=source, destination=destination) as (cell, pool):
        log = InMemoryEventLog()
        log.append(
            [
                NewEvent(
                    EngineRegistered(engine=f"{RUN}:cell-0", run_id=RUN, url=cell.base_url, cell_index=0)
                ),
                NewEvent(
                    EngineRegistered(engine=f"{RUN}:pool-0", run_id=RUN, url=pool.base_url, cell_index=-1)
                ),
                NewEvent(ExecutionStarted(execution_id=f"{RUN}/e0", run_id=RUN, engine="cell-0")),
            ]
        )
        stop = threading.Event()
        with ProxyService(log, ProxyConfig(engines=[], context_limit=8192, run_id=RUN)) as proxy:
            follower = threading.Thread(target=proxy.follow, args=(stop,), daemon=True)
            follower.start()
            try:
                deadline = time.monotonic() + 10
                while len(proxy.router.engines()) < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
                key = issue_key(log, execution_id=f"{RUN}/e0", run_id=RUN, harness="claude-code")
                client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
                httpx.post(  # the pool engine's script is one answer ahead otherwise
                    pool.base_url + "/generate",
                    json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}},
                )
                pieces: list[str] = []

                def move_soon() -> None:
                    while len("".join(pieces)) < 20:
                        time.sleep(0.005)
                    log.append(
                        [
                            NewEvent(EngineRoutingChanged(engine=f"{RUN}:cell-0", accepting=False)),
                            NewEvent(ExecutionRerouted(execution_id=f"{RUN}/e0", run_id=RUN, engine="pool")),
                        ]
                    )

                mover = threading.Thread(target=move_soon)
                mover.start()
                with client.messages.stream(
                    model="gyre", max_tokens=1000, messages=[{"role": "user", "content": "explain"}]
                ) as stream:
                    for piece in stream.text_stream:
                        pieces.append(piece)
                    final = stream.get_final_message()
                mover.join(10)
                assert final.stop_reason == "end_turn"
                assert (proxy.pipeline.moved, proxy.pipeline.kv_migrated) == (1, 1)
                assert proxy.spool.flush(30)
            finally:
                stop.set()
                follower.join(10)
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
