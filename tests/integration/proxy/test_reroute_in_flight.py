"""The scheduler moves an execution to another engine while its answer streams: the proxy,
following the log, cancels the request on the old engine only once the new route is known,
and the answer continues on the new engine; the harness sees one uninterrupted response."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.service import ProxyConfig, ProxyService, issue_key
from gyre_store import (
    EngineRegistered,
    EngineRoutingChanged,
    ExecutionRerouted,
    ExecutionStarted,
    InMemoryEventLog,
    InMemoryProjectionStore,
    MovePath,
    NewEvent,
    RequestMoved,
    catch_up,
)
from gyre_store.log import StreamId
from gyre_store.trees import TreeProjection, TreeView

RUN = "run-move"
LONG = "The files are listed above. " + "Here is a long explanation of every one of them. " * 40


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[ReferenceEngineServer]]:
    # Identical engines (same seed, same script), so the answer can continue on either.
    servers = []
    for i in range(2):
        folder = tmp_path / f"e{i}"
        folder.mkdir()
        (folder / "script.json").write_text(json.dumps({"outputs": [LONG, LONG], "rule": "in_order"}))
        cfg = ReferenceEngineConfig(
            source=ModelSource(tokenizer="qwen", seed=0), max_context=8192, script=folder / "script.json"
        )
        servers.append(ReferenceEngineServer(cfg).__enter__())
    yield servers
    for server in servers:
        server.__exit__(None, None, None)


@pytest.mark.parametrize("kv_migration", [True, False])
def test_a_moved_execution_continues_on_its_new_engine(
    engines: list[ReferenceEngineServer], kv_migration: bool
) -> None:
    cell, pool = engines
    log = InMemoryEventLog()
    log.append(
        [
            NewEvent(EngineRegistered(engine=f"{RUN}:cell-0", run_id=RUN, url=cell.base_url, cell_index=0)),
            NewEvent(EngineRegistered(engine=f"{RUN}:pool-0", run_id=RUN, url=pool.base_url, cell_index=-1)),
            NewEvent(ExecutionStarted(execution_id=f"{RUN}/e0", run_id=RUN, engine="cell-0")),
        ]
    )
    stop = threading.Event()
    with ProxyService(log, ProxyConfig(engines=[], context_limit=8192, run_id=RUN)) as proxy:
        proxy.pipeline.kv_migration = kv_migration
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
                # What the controller's live sink appends when cell 0 leaves rollout.
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
            # One response: the cancelled attempt's text, then the new engine's (a scripted engine
            # starts its script again; a model would continue from the tokens it is given).
            text = "".join(pieces)
            assert text.startswith("The files are") and text.rstrip().endswith(LONG.rstrip())
            assert final.stop_reason == "end_turn"
            assert proxy.pipeline.moved == 1  # cancelled because it moved, not because an engine failed
            assert proxy.pipeline.kv_migrated == int(kv_migration)
            assert proxy.router.engine_for(f"{RUN}/e0").name == f"{RUN}:pool-0"
            assert proxy.spool.flush(30)
        finally:
            stop.set()
            follower.join(10)
    projection = TreeProjection()
    store = InMemoryProjectionStore({t.name: t for t in projection.tables})
    catch_up(log, store, projection)
    view = TreeView.load(store, f"{RUN}/e0")
    by_seq = sorted(view.records.values(), key=lambda r: r.seq)
    assert [r.finish for r in by_seq] == ["abort", "stop"]
    calls = [r.event for r in log.read_stream(StreamId("calls", f"{RUN}/e0"))]
    assert [c.engine for c in calls] == [f"{RUN}:cell-0", f"{RUN}:pool-0"]  # type: ignore[attr-defined]
    assert by_seq[0].output_len > 0  # the cancelled attempt's tokens were kept and continued from
    [moved] = [r.event for r in log.read(0) if isinstance(r.event, RequestMoved)]
    assert (moved.source, moved.destination) == (f"{RUN}:cell-0", f"{RUN}:pool-0")
    if kv_migration:
        # Its KV cache went with it: every position the cancelled attempt had computed, the
        # request's whole input and the tokens sampled before the cancel.
        assert moved.path is MovePath.KV_MIGRATION
        assert moved.kv_tokens == by_seq[0].input_len + by_seq[0].output_len
    else:
        assert (moved.path, moved.kv_tokens, moved.detail) == (MovePath.REPREFILL, 0, "KV migration is off")
