"""The trajectory-tree projection on random record sequences (splits anywhere)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_store import (
    ConfigError,
    InMemoryEventLog,
    InMemoryProjectionStore,
    MalformedEvent,
    ProjectionError,
    catch_up,
    rebuild,
)
from gyre_store.catalog import AgentKind, CallFinish, CallPurpose, ModelCallRecorded, Provenance, TitoArrays
from gyre_store.trees import TrajectoryRecorder, TreeProjection, TreeTopology, TreeView, resolve_nodes


def arrays(
    new_in: list[int], out: list[int], *, trainable: bool = True, out_prov: int = Provenance.SAMPLED
) -> TitoArrays:
    n = len(out)
    return TitoArrays(
        input_ids=np.array(new_in, np.int32),
        input_prov=np.full(len(new_in), Provenance.USER, np.uint8),
        msg_ends=np.zeros(0, np.int32),
        msg_hashes=np.zeros(0, np.uint32),
        output_ids=np.array(out, np.int32),
        output_logprobs=np.linspace(-1, -0.1, n).astype(np.float32),
        output_prov=np.full(n, out_prov, np.uint8),
        output_trainable=np.full(n, trainable, np.bool_),
        output_hash=np.zeros(0, np.uint32),
    )


def call(rid: str, prefix_of: str | None = None, prefix_len: int = 0, **kw: object) -> ModelCallRecorded:
    return ModelCallRecorded(
        execution_id="ex", run_id="run", request_id=rid, prefix_of=prefix_of, prefix_len=prefix_len, **kw
    )  # type: ignore[arg-type]


@st.composite
def record_sequences(draw: st.DrawFn) -> list[tuple[ModelCallRecorded, TitoArrays]]:
    out: list[tuple[ModelCallRecorded, TitoArrays]] = []
    lengths: dict[str, int] = {}
    tok = st.lists(st.integers(0, 50), max_size=12)
    for i in range(draw(st.integers(1, 25))):
        rid = f"r{i}"
        if lengths and draw(st.booleans()):
            parent = draw(st.sampled_from(sorted(lengths)))
            plen = draw(st.integers(0, lengths[parent]))
        else:
            parent, plen = None, 0
        new_in = draw(tok)
        if not new_in and plen == 0:
            new_in = [1]
        outp = draw(tok)
        retry_of = draw(st.none() | st.sampled_from(sorted(lengths))) if lengths else None
        ev = call(
            rid,
            parent if plen else None,
            plen,
            agent_kind=draw(st.sampled_from(list(AgentKind))),
            purpose=draw(st.sampled_from(list(CallPurpose))),
            retry_of=retry_of,
        )
        out.append((ev, arrays(new_in, outp)))
        lengths[rid] = plen + len(new_in) + len(outp)
    return out


def naive_inputs(records: list[tuple[ModelCallRecorded, TitoArrays]]) -> dict[str, np.ndarray]:
    full: dict[str, np.ndarray] = {}
    inputs: dict[str, np.ndarray] = {}
    for ev, a in records:
        prefix = full[ev.prefix_of][: ev.prefix_len] if ev.prefix_of else np.zeros(0, np.int32)
        inputs[ev.request_id] = np.concatenate([prefix, a.input_ids])
        full[ev.request_id] = np.concatenate([inputs[ev.request_id], a.output_ids])
    return inputs


def project(log: InMemoryEventLog) -> InMemoryProjectionStore:
    p = TreeProjection()
    store = InMemoryProjectionStore({t.name: t for t in p.tables}, log)
    catch_up(log, store, p, batch=4)
    return store


@settings(max_examples=80)
@given(record_sequences())
def test_every_record_rebuilds_exactly_and_rebuild_equals_incremental(
    records: list[tuple[ModelCallRecorded, TitoArrays]],
) -> None:
    log = InMemoryEventLog()
    recorder = TrajectoryRecorder(log)
    p = TreeProjection()
    live = InMemoryProjectionStore({t.name: t for t in p.tables}, log)
    for ev, a in records:
        recorder.record(ev, a)
        catch_up(log, live, p, batch=3)
    view = TreeView.load(live, "ex")
    for rid, expected in naive_inputs(records).items():
        got, prov = view.input_of(rid)
        np.testing.assert_array_equal(got, expected)
        assert prov.shape == got.shape
    for ev, a in records:
        out, lp = view.output_of(ev.request_id)
        np.testing.assert_array_equal(out, a.output_ids)
        np.testing.assert_array_equal(lp, a.output_logprobs)
    # stored tokens never exceed what the records carried, and the tree is a forest
    assert sum(n.tokens.shape[0] for n in view.nodes.values()) == sum(
        a.input_len + a.output_len for _, a in records
    )
    assert_topology_matches(TreeTopology.load(live, "ex"), view)
    fresh = InMemoryProjectionStore({t.name: t for t in p.tables}, log)
    rebuild(log, fresh, p)
    for t in p.tables:
        assert fresh.dump(t.name) == live.dump(t.name)


def assert_topology_matches(topology: TreeTopology, view: TreeView) -> None:
    """The token-free topology row says what the loaded nodes and records say."""
    assert topology.num_nodes == len(view.nodes)
    for node_id, node in view.nodes.items():
        assert topology.parents[node_id] == (-1 if node.parent_id is None else node.parent_id)
        assert topology.starts[node_id] == node.start
        trainable = 0 if node.trainable is None else int(node.trainable.sum())
        assert topology.trainable[node_id] == trainable
    assert topology.leaves == tuple((c.leaf, c.leaf_class) for c in view.candidates())


def test_split_in_the_middle_of_an_output_keeps_both_halves_trainable() -> None:
    log = InMemoryEventLog()
    rec = TrajectoryRecorder(log)
    rec.record(call("a"), arrays([1, 2, 3], [10, 11, 12, 13]))
    rec.record(call("b", "a", 5), arrays([7], [20]))  # shares 1,2,3,10,11
    view = TreeView.load(project(log), "ex")
    np.testing.assert_array_equal(view.input_of("b")[0], [1, 2, 3, 10, 11, 7])
    np.testing.assert_array_equal(view.output_of("a")[0], [10, 11, 12, 13])
    assert view.stats().trainable_tokens == 5  # 4 of a's output (split in two nodes) + 1 of b's
    assert {c.request_id for c in view.candidates()} == {"a", "b"}


def test_nodes_refer_to_their_records_payloads_and_a_split_moves_the_offsets() -> None:
    log = InMemoryEventLog()
    rec = TrajectoryRecorder(log)
    a = arrays([1, 2, 3], [10, 11, 12, 13])
    rec.record(call("a"), a)
    rec.record(call("b", "a", 5), arrays([7], [20]))  # splits a's output after 10, 11
    store = project(log)
    rows = store.select("gyre_tree_nodes", "execution_id", "ex")
    assert not {"tokens", "provenance", "logprobs", "trainable"} & set(rows[0])  # no copies
    view = TreeView.load(store, "ex")
    # the two halves of a's output refer to one payload, the lower one 2 tokens further in
    halves = sorted(
        (n for n in view.nodes.values() if n.kind == "output" and n.request_id == "a"), key=lambda n: n.start
    )
    np.testing.assert_array_equal(halves[0].tokens, [10, 11])
    np.testing.assert_array_equal(halves[1].tokens, [12, 13])
    np.testing.assert_array_equal(np.concatenate([h.logprobs for h in halves]), a.output_logprobs)  # type: ignore[misc]
    by_id = {r["node_id"]: r for r in rows}
    upper, lower = (by_id[h.node_id] for h in halves)
    assert upper["position"] == lower["position"]
    assert lower["tokens_at"] == upper["tokens_at"] + 8 and lower["logprobs_at"] == upper["logprobs_at"] + 8
    assert lower["provenance_at"] == upper["provenance_at"] + 2
    assert lower["trainable_at"] == upper["trainable_at"] + 2
    assert [n.trainable.tolist() for n in halves] == [[True, True], [True, True]]  # type: ignore[union-attr]


def test_a_node_whose_payload_is_missing_or_short_is_a_clear_error() -> None:
    log = InMemoryEventLog()
    TrajectoryRecorder(log).record(call("a"), arrays([1, 2, 3], [10]))
    p = TreeProjection()
    without_log = InMemoryProjectionStore({t.name: t for t in p.tables})
    catch_up(log, without_log, p)
    with pytest.raises(ConfigError, match="without its event log"):
        TreeView.load(without_log, "ex")
    store = project(log)
    [row, *_] = store.select("gyre_tree_nodes", "execution_id", "ex")
    with pytest.raises(ProjectionError, match="which has no payload"):
        resolve_nodes(store, [{**row, "position": 99}])
    with pytest.raises(ProjectionError, match="refers to bytes"):
        resolve_nodes(store, [{**row, "tokens_at": row["tokens_at"] + 10_000}])


def test_duplicate_delivery_is_idempotent() -> None:
    log = InMemoryEventLog()
    rec = TrajectoryRecorder(log)
    first = rec.record(call("a"), arrays([1, 2], [3]))
    again = TrajectoryRecorder(log).record(call("a"), arrays([1, 2], [3]))  # a restarted writer
    assert again.duplicate and again.position == first.position
    assert len(TreeView.load(project(log), "ex").records) == 1


def test_bad_records_are_refused_and_nothing_changes() -> None:
    log = InMemoryEventLog()
    rec = TrajectoryRecorder(log)
    rec.record(call("a"), arrays([1, 2], [3]))
    with pytest.raises(MalformedEvent, match="does not exist"):
        rec.record(call("b", "nope", 1), arrays([4], [5]))
    with pytest.raises(MalformedEvent, match="has only 3"):
        rec.record(call("b", "a", 9), arrays([4], [5]))
    bad = arrays([4], [5, 6])
    with pytest.raises(MalformedEvent, match="output tokens but"):
        rec.record(call("b", "a", 3), _replace(bad, output_logprobs=np.zeros(1, np.float32)))
    with pytest.raises(MalformedEvent, match="not sampled by the engine"):
        rec.record(call("b", "a", 3), arrays([4], [5], out_prov=Provenance.INJECTED_ASSISTANT))
    with pytest.raises(MalformedEvent, match="retries unknown"):
        rec.record(call("b", "a", 3, retry_of="ghost"), arrays([4], [5]))
    assert log.head() == 1
    rec.record(call("b", "a", 3), arrays([4], [5]))  # the recorder is still consistent
    assert log.head() == 2


def _replace(a: TitoArrays, **changes: object) -> TitoArrays:
    from dataclasses import replace

    return replace(a, **changes)  # type: ignore[arg-type]


def test_classes_follow_agent_and_purpose_and_unknown_falls_back_to_roots() -> None:
    log = InMemoryEventLog()
    rec = TrajectoryRecorder(log)
    rec.record(call("m1", agent_kind=AgentKind.MAIN), arrays([1, 2], [3]))
    rec.record(
        call("m2", "m1", 2, agent_kind=AgentKind.MAIN, purpose=CallPurpose.COMPACTION), arrays([9], [8])
    )
    rec.record(call("s1", agent_kind=AgentKind.SUB_AGENT), arrays([5, 6], [7]))
    rec.record(
        call("s2", "s1", 3, agent_kind=AgentKind.SUB_AGENT, purpose=CallPurpose.COMPACTION), arrays([4], [4])
    )
    rec.record(call("u1", agent_kind=AgentKind.UNKNOWN), arrays([30], [31]))
    classes = {c.request_id: c.leaf_class.value for c in TreeView.load(project(log), "ex").candidates()}
    assert classes == {"m1": "main", "m2": "main_summary", "s2": "sub_agent_summary", "u1": "sub_agent"}

    log2 = InMemoryEventLog()
    rec2 = TrajectoryRecorder(log2)
    rec2.record(call("a"), arrays([1], [2]))  # UNKNOWN: first root is main
    rec2.record(call("b"), arrays([5], [6]))
    classes2 = {c.request_id: c.leaf_class.value for c in TreeView.load(project(log2), "ex").candidates()}
    assert classes2 == {"a": "main", "b": "sub_agent"}


def test_a_retry_supersedes_the_attempt_it_replaces() -> None:
    log = InMemoryEventLog()
    rec = TrajectoryRecorder(log)
    rec.record(call("a"), arrays([1, 2], [3, 4], trainable=False), None)
    rec.record(call("a2", "a", 2, retry_of="a", finish=CallFinish.STOP), arrays([], [5, 6]))
    view = TreeView.load(project(log), "ex")
    assert [c.request_id for c in view.candidates()] == ["a2"]
    assert view.records["a"].superseded


@settings(max_examples=60)
@given(record_sequences(), st.integers(0, 25))
def test_folding_records_at_once_leaves_the_rows_applying_them_one_by_one_leaves(
    records: list[tuple[ModelCallRecorded, TitoArrays]], redelivered: int
) -> None:
    """``fold`` (each topology decoded and encoded once) against ``apply`` per record, over two
    executions' records interleaved and some delivered again."""
    log = InMemoryEventLog()
    recorder = TrajectoryRecorder(log)
    for ev, a in records:
        recorder.record(ev, a)
        recorder.record(msgspec.structs.replace(ev, execution_id="ex2"), a)
    events = log.read(0, limit=1000)
    events += events[:redelivered]
    p = TreeProjection()
    one_by_one = InMemoryProjectionStore({t.name: t for t in p.tables}, log)
    with one_by_one.transaction() as rows:
        for event in events:
            p.apply(rows, event)
    folded = InMemoryProjectionStore({t.name: t for t in p.tables}, log)
    with folded.transaction() as rows:
        p.fold(rows, events)
    for t in p.tables:
        assert folded.dump(t.name) == one_by_one.dump(t.name)
    assert TreeTopology.load(folded, "ex2").leaves == TreeTopology.load(one_by_one, "ex").leaves
