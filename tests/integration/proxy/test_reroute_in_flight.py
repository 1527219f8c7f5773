"""The scheduler moves an execution to another engine while its answer streams: the proxy,
following the log, cancels the request on the old engine only once the new route is known,
and the answer continues on the new engine; the harness sees one uninterrupted response."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre_proxy.engines.refengine import ReferenceEngineServer
from gyre_proxy.service import ProxyService
from gyre_store import (
    InMemoryEventLog,
    InMemoryProjectionStore,
    MovePath,
    RequestMoved,
    catch_up,
)
from gyre_store.log import StreamId
from gyre_store.trees import TreeProjection, TreeView
from tests.integration.proxy.moves import LONG, move_mid_answer, scripted_engines

RUN = "run-move"


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[ReferenceEngineServer]]:
    with scripted_engines(tmp_path, {}, {}) as servers:
        yield servers


@pytest.mark.parametrize("kv_migration", [True, False])
def test_a_moved_execution_continues_on_its_new_engine(
    engines: list[ReferenceEngineServer], kv_migration: bool
) -> None:
    cell, pool = engines
    log = InMemoryEventLog()

    def configure(proxy: ProxyService) -> None:
        proxy.pipeline.kv_migration = kv_migration

    moved_answer = move_mid_answer(log, RUN, cell, pool, configure=configure)
    # One response: the cancelled attempt's text, then the new engine's (a scripted engine
    # starts its script again; a model would continue from the tokens it is given).
    text = moved_answer.text
    assert text.startswith("The files are") and text.rstrip().endswith(LONG.rstrip())
    assert moved_answer.stop_reason == "end_turn"
    assert moved_answer.moved == 1  # cancelled because it moved, not because an engine failed
    assert moved_answer.kv_migrated == int(kv_migration)
    projection = TreeProjection()
    store = InMemoryProjectionStore({t.name: t for t in projection.tables}, log)
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
