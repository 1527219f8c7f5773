"""The tree projection's rows on PostgreSQL stay whole when a catch-up fails midway or runs
beside others: the state row's ``next_node``, its topology blob and the node rows agree, and
they equal a rebuild from the log."""

from __future__ import annotations

import random
import threading
from typing import Any

import numpy as np
import pytest

from gyre_store import (
    InMemoryProjectionStore,
    PostgresEventLog,
    PostgresProjectionStore,
    ProjectionError,
    catch_up,
    rebuild,
)
from gyre_store.catalog import ModelCallRecorded, Provenance, TitoArrays
from gyre_store.projections import ProjectionStore, Row, RowStore
from gyre_store.trees import TrajectoryRecorder, TreeProjection, TreeTopology


def arrays(new_in: int, out: int, seed: int) -> TitoArrays:
    rng = np.random.default_rng(seed)
    return TitoArrays(
        input_ids=rng.integers(0, 50, new_in).astype(np.int32),
        input_prov=np.full(new_in, Provenance.USER, np.uint8),
        msg_ends=np.zeros(0, np.int32),
        msg_hashes=np.zeros(0, np.uint32),
        output_ids=rng.integers(0, 50, out).astype(np.int32),
        output_logprobs=np.full(out, -0.5, np.float32),
        output_prov=np.full(out, Provenance.SAMPLED, np.uint8),
        output_trainable=np.ones(out, np.bool_),
        output_hash=np.zeros(0, np.uint32),
    )


def records(execution_id: str, n: int, seed: int) -> list[tuple[ModelCallRecorded, TitoArrays]]:
    """``n`` records of one execution; most extend an earlier one by part of it (a split)."""
    rng = random.Random(seed)
    out: list[tuple[ModelCallRecorded, TitoArrays]] = []
    lengths: dict[str, int] = {}
    for i in range(n):
        rid = f"{execution_id}-r{i}"
        parent = rng.choice(sorted(lengths)) if lengths and rng.random() < 0.8 else None
        plen = rng.randint(1, lengths[parent]) if parent is not None else 0
        a = arrays(rng.randint(1, 6), rng.randint(0, 6), seed * 1000 + i)
        ev = ModelCallRecorded(
            execution_id=execution_id, run_id="run", request_id=rid, prefix_of=parent, prefix_len=plen
        )
        out.append((ev, a))
        lengths[rid] = plen + a.input_len + a.output_len
    return out


def assert_whole(store: ProjectionStore, log: PostgresEventLog) -> None:
    """Each state row's next_node counts its topology's nodes and its node rows, and every
    table equals a rebuild of the log."""
    p = TreeProjection()
    states = store.dump("gyre_tree_state")
    assert states
    for state in states:
        ex = state["execution_id"]
        nodes = store.select("gyre_tree_nodes", "execution_id", ex)
        assert int(state["next_node"]) == TreeTopology.load(store, ex).num_nodes == len(nodes), ex
    fresh = InMemoryProjectionStore({t.name: t for t in p.tables}, log)
    rebuild(log, fresh, p)
    for t in p.tables:
        assert store.dump(t.name) == fresh.dump(t.name), t.name


class FailsInsideRecord(TreeProjection):
    """Raises while applying ``request_id``: after its input node is written, before its output node."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id

    def _add_node(self, rows: RowStore, state: Row, topology: Any, ex: str, parent: Row | None,
                  kind: str, by: str, n: int, trainable: int, **arrays: Any) -> Row:  # fmt: skip
        if by == self.request_id and kind == "output":
            raise ProjectionError(f"injected failure inside {by}")
        return super()._add_node(rows, state, topology, ex, parent, kind, by, n, trainable, **arrays)


def test_a_catch_up_that_fails_inside_a_record_leaves_nothing_and_its_retry_is_whole(
    pg_log: PostgresEventLog,
) -> None:
    recorder = TrajectoryRecorder(pg_log)
    batch = records("ex-a", 12, seed=1) + records("ex-b", 12, seed=2)
    batch.sort(key=lambda r: int(r[0].request_id.rsplit("r", 1)[1]))  # the two executions interleaved
    for ev, a in batch:
        recorder.record(ev, a)
    p = TreeProjection()
    store = PostgresProjectionStore(pg_log.pool, {t.name: t for t in p.tables})
    catch_up(pg_log, store, p, until=6, batch=100)  # a first part committed before the failure
    first = store.checkpoint(p.checkpoint_name)
    before = {t.name: store.dump(t.name) for t in p.tables}
    failing = next(ev.request_id for ev, a in batch[8:] if a.output_len and a.input_len)

    with pytest.raises(ProjectionError, match="injected failure"):
        catch_up(pg_log, store, FailsInsideRecord(failing), batch=100)

    # The failed batch (records before the failing one, and its input node) left no row.
    assert store.checkpoint(p.checkpoint_name) == first
    assert {t.name: store.dump(t.name) for t in p.tables} == before
    assert catch_up(pg_log, store, p, batch=5) == pg_log.head()
    assert_whole(store, pg_log)


def test_projectors_catching_up_growing_trees_side_by_side_leave_whole_rows(
    pg_log: PostgresEventLog,
) -> None:
    """Three projectors (different batch sizes and cuts of the log) catch up while records of
    two executions are appended; each event is applied once, by one of them."""
    p = TreeProjection()
    store = PostgresProjectionStore(pg_log.pool, {t.name: t for t in p.tables})
    recorder = TrajectoryRecorder(pg_log)
    pending = records("ex-c", 40, seed=3) + records("ex-d", 40, seed=4)
    pending.sort(key=lambda r: int(r[0].request_id.rsplit("r", 1)[1]))
    done = threading.Event()
    errors: list[BaseException] = []

    def project(batch: int) -> None:
        try:
            while not done.is_set():
                head = pg_log.head()
                catch_up(pg_log, store, p, until=max(0, head - batch % 3), batch=batch)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=project, args=(b,)) for b in (1, 2, 7)]
    for t in threads:
        t.start()
    try:
        for i in range(0, len(pending), 4):
            for ev, a in pending[i : i + 4]:
                recorder.record(ev, a)
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert catch_up(pg_log, store, p) == pg_log.head()
    assert_whole(store, pg_log)
