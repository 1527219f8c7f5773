"""Trajectory trees on real PostgreSQL: exact rebuild in Python and in SQL, views, replay."""

from __future__ import annotations

import uuid

import numpy as np
import psycopg

from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.harness import ClaudeCodeHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, TraceConfig, TraceGenerator
from gyre_store import PostgresEventLog, PostgresProjectionStore, StoreConfig, catch_up, rebuild
from gyre_store.db import migrate
from gyre_store.trees import TrajectoryRecorder, TreeProjection, TreeTopology, TreeView, resolve_nodes
from tests import pg
from tests.unit.store.test_trees import arrays, call

SMALL = TraceConfig(
    seed=5,
    main_requests=40,
    compact_at=8_000,
    subagents=1,
    subagent_requests=(5, 8),
    subagent_compact_at=2_000,
    retry_every=13,
    tool_result_words=(30, 200),
    interrupt_at=4,
)


def test_generated_execution_on_postgres(pg_log: PostgresEventLog, database_url: str) -> None:
    ing = Ingestor(TrajectoryRecorder(pg_log), Qwen3Template(qwen_tokenizer()), ClaudeCodeHarness())
    TraceGenerator(ing, SMALL).run("ex-pg", "run-pg")
    p = TreeProjection()
    live = PostgresProjectionStore(pg_log.pool, {t.name: t for t in p.tables})
    catch_up(pg_log, live, p, batch=7)
    view = TreeView.load(live, "ex-pg")

    # A fresh recorder (a restarted proxy) rebuilds its context from the log alone.
    ctx = TrajectoryRecorder(pg_log).context("ex-pg")
    assert set(ctx.lengths) == set(view.records)

    with psycopg.connect(database_url) as conn:
        for rid, rec in view.records.items():
            expected, _ = view.input_of(rid)
            (sql_input,) = conn.execute("SELECT gyre_record_input_v1(%s, %s)", ("ex-pg", rid)).fetchone()  # type: ignore[misc]
            assert sql_input == expected.tolist(), rid
            assert len(sql_input) == rec.input_len
        rows = conn.execute(
            "SELECT leaf_class, count(*) FROM gyre_candidate_trajectories_v WHERE execution_id = 'ex-pg' GROUP BY 1"
        ).fetchall()
        assert dict(rows) == view.stats().candidates_by_class
        (n_records,) = conn.execute(
            "SELECT count(*) FROM gyre_records_v WHERE execution_id = 'ex-pg'"
        ).fetchone()  # type: ignore[misc]
        assert n_records == len(view.records)
        # Payloads are stored compressed (migration 0007) and the nodes hold no token ids or
        # logprobs of their own (0008): every node's slice lies inside its record's payload.
        (compressed_payloads,) = conn.execute(
            "SELECT count(*) FROM gyre_events WHERE pg_column_compression(payload) IS NOT NULL"
        ).fetchone()  # type: ignore[misc]
        assert compressed_payloads > 0
        columns = {
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'gyre_tree_nodes'"
            )
        }
        assert {"position", "tokens_at", "provenance_at", "logprobs_at", "trainable_at"} <= columns
        assert not {"tokens", "provenance", "logprobs", "trainable"} & columns
        (outside,) = conn.execute(
            "SELECT count(*) FROM gyre_tree_nodes n JOIN gyre_events e ON e.position = n.position "
            "WHERE n.execution_id = 'ex-pg' AND (n.tokens_at + 4 * n.n_tokens > length(e.payload) "
            "OR e.event_type <> 'model_call.recorded')"
        ).fetchone()  # type: ignore[misc]
        assert outside == 0

    # The topology row agrees with the nodes; a few nodes are read by id without the rest.
    topology = TreeTopology.load(live, "ex-pg")
    assert topology.parents.tolist() == [
        -1 if view.nodes[n].parent_id is None else view.nodes[n].parent_id for n in range(len(view.nodes))
    ]
    assert topology.leaves == tuple((c.leaf, c.leaf_class) for c in view.candidates())
    some = sorted(view.nodes)[::3]
    picked = live.select_in("gyre_tree_nodes", "execution_id", "ex-pg", "node_id", some)
    assert [r["node_id"] for r in picked] == some
    for node in resolve_nodes(live, picked):
        np.testing.assert_array_equal(node.tokens, view.nodes[node.node_id].tokens)
        assert node.logprobs is None or np.array_equal(node.logprobs, view.nodes[node.node_id].logprobs)

    replica = PostgresProjectionStore(pg_log.pool, {t.name: t for t in p.tables}, schema="trees_rebuilt")
    replica.create_schema()
    rebuild(pg_log, replica, p)
    for t in p.tables:
        assert replica.dump(t.name) == live.dump(t.name)
    # replay to mid-run gives the tree of the first half of the records
    half = sorted(view.records.values(), key=lambda r: r.seq)[len(view.records) // 2]
    with psycopg.connect(database_url) as conn:
        (pos,) = conn.execute(
            "SELECT position FROM gyre_tree_records WHERE request_id = %s", (half.request_id,)
        ).fetchone()  # type: ignore[misc]
    past = PostgresProjectionStore(pg_log.pool, {t.name: t for t in p.tables}, schema="trees_past")
    past.create_schema()
    rebuild(pg_log, past, p, until=pos)
    past_view = TreeView.load(past, "ex-pg")
    assert len(past_view.records) == half.seq + 1
    np.testing.assert_array_equal(past_view.input_of(half.request_id)[0], view.input_of(half.request_id)[0])


def test_migration_0008_empties_copied_trees_and_the_next_catch_up_rebuilds_them() -> None:
    """A database at 0007 with records and a tree in the copying layout: the upgrade drops the
    copies and the projection's checkpoint, keeps every record, and the next catch-up rebuilds
    the tree in the referring layout from the log."""
    name = "gyre_mig8_" + uuid.uuid4().hex[:8]
    with pg.admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg.url_for(name)
    try:
        migrate.upgrade(url, "0007")
        with PostgresEventLog(StoreConfig(url)) as log:
            recorder = TrajectoryRecorder(log)
            recorder.record(call("a"), arrays([1, 2, 3], [10, 11, 12]))
            recorder.record(call("b", "a", 4), arrays([7, 8], [20]))
        with psycopg.connect(url, autocommit=True) as conn:  # the tree as 0007's projection left it
            conn.execute(
                "INSERT INTO gyre_tree_nodes (execution_id, node_id, parent_id, root_id, kind, start, "
                "n_tokens, tokens, provenance, logprobs, trainable, msg_ends, path_trainable, "
                "path_messages, children, request_id) VALUES ('ex', 0, NULL, 0, 'input', 0, 3, "
                "'\\x010000000200000003000000', '\\x020202', NULL, NULL, '\\x', 0, 0, 0, 'a')"
            )
            conn.execute("INSERT INTO gyre_checkpoints (name, position) VALUES ('projection:trees', 1)")
        migrate.upgrade(url)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM gyre_tree_nodes").fetchone() == (0,)
            assert conn.execute(
                "SELECT count(*) FROM gyre_checkpoints WHERE name = 'projection:trees'"
            ).fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM gyre_events").fetchone() == (2,)
        with PostgresEventLog(StoreConfig(url)) as log:
            p = TreeProjection()
            store = PostgresProjectionStore(log.pool, {t.name: t for t in p.tables})
            catch_up(log, store, p)
            view = TreeView.load(store, "ex")
            np.testing.assert_array_equal(view.input_of("b")[0], [1, 2, 3, 10, 7, 8])
            with psycopg.connect(url) as conn:
                (sql_input,) = conn.execute("SELECT gyre_record_input_v1('ex', 'b')").fetchone()  # type: ignore[misc]
            assert sql_input == [1, 2, 3, 10, 7, 8]
    finally:
        pg.drop(name)
