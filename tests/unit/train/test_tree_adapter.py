"""Stored trees as admission input: parent-first order, candidates, and provenance masks (critique)."""

from __future__ import annotations

import dataclasses

import numpy as np

from gyre_store import InMemoryEventLog
from gyre_store.catalog import ModelCallRecorded, Provenance, TitoArrays, new_record
from gyre_store.trees import TreeView
from gyre_train import AdmissionConfig, LeafClass, admission_rng, admit, materialize_rows, stored_execution
from tests.unit.train.runs import catch_all, memory_store, record_trace

P = Provenance


def _arrays(inp: list[tuple[int, Provenance]], out: list[tuple[int, Provenance]]) -> TitoArrays:
    sampled = np.array([p == P.SAMPLED for _, p in out], dtype=np.bool_)
    return TitoArrays(
        input_ids=np.array([t for t, _ in inp], dtype="<i4"),
        input_prov=np.array([p for _, p in inp], dtype="|u1"),
        msg_ends=np.zeros(0, dtype="<i4"),
        msg_hashes=np.zeros(0, dtype="<u4"),
        output_ids=np.array([t for t, _ in out], dtype="<i4"),
        output_logprobs=np.where(sampled, -0.5, 0.0).astype("<f4"),
        output_prov=np.array([p for _, p in out], dtype="|u1"),
        output_trainable=sampled,
        output_hash=np.zeros(0, dtype="<u4"),
    )


def test_critique_a_later_request_consumed_is_context_never_a_target() -> None:
    log = InMemoryEventLog()
    first = ModelCallRecorded(execution_id="x", run_id="r", request_id="r1")
    log.append([new_record(first, _arrays([(1, P.SYSTEM), (2, P.USER)], [(10, P.SAMPLED), (11, P.SAMPLED)]))])
    # The evaluator's critique comes back to the policy inside the next request's input.
    second = ModelCallRecorded(execution_id="x", run_id="r", request_id="r2", prefix_of="r1", prefix_len=4)
    critique = [(50, P.CRITIQUE), (51, P.CRITIQUE), (52, P.CRITIQUE)]
    log.append([new_record(second, _arrays([*critique, (3, P.USER)], [(12, P.SAMPLED), (13, P.TEMPLATE)]))])
    store = memory_store(log)
    catch_all(log, store)
    stored = stored_execution(TreeView.load(store, "x"))
    assert stored.excluded_critique == 3
    admission = admit(stored.tree, AdmissionConfig(max_trajectories=None), admission_rng(0, "x"))
    [row] = materialize_rows("x", stored.tree, stored.tokens, admission)
    assert row.token_ids.tolist() == [1, 2, 10, 11, 50, 51, 52, 3, 12]
    assert row.token_ids[row.target_mask].tolist() == [10, 11, 12]  # sampled only


def test_a_generated_tree_in_admission_form() -> None:
    log = InMemoryEventLog()
    record_trace(log, "ex", "r")
    store = memory_store(log)
    catch_all(log, store)
    view = TreeView.load(store, "ex")
    stored = stored_execution(view)
    parents = stored.tree.parents
    assert np.all(parents < np.arange(parents.shape[0]))  # parents first
    assert stored.tree.num_nodes == len(view.nodes)
    mapped = {stored.node_ids[leaf.node]: leaf.leaf_class for leaf in stored.tree.leaves}
    assert mapped == {c.leaf: LeafClass(c.leaf_class.value) for c in view.candidates()}
    assert int(stored.tree.trainable_counts.sum()) == view.stats().trainable_tokens
    uncapped = admit(stored.tree, AdmissionConfig(max_trajectories=None), admission_rng(0, "ex"))
    assert uncapped.target_count == stored.trainable_on_candidates()
    rows = materialize_rows("ex", stored.tree, stored.tokens, uncapped)
    for row, trajectory in zip(rows, uncapped.trajectories, strict=True):
        leaf_id = stored.node_ids[trajectory.leaf.node]
        request = next(c.request_id for c in view.candidates() if c.leaf == leaf_id)
        full = np.concatenate([*view.input_of(request)[:1], view.output_of(request)[0]])
        assert np.array_equal(row.token_ids, full[: len(row)])  # recorded ids, never re-tokenized


def test_only_sampled_tokens_are_targets_even_if_a_mask_says_otherwise() -> None:
    log = InMemoryEventLog()
    first = ModelCallRecorded(execution_id="x", run_id="r", request_id="r1")
    out = [(10, P.SAMPLED), (60, P.CRITIQUE), (11, P.SAMPLED)]
    log.append([new_record(first, _arrays([(1, P.SYSTEM), (50, P.CRITIQUE)], out))])
    store = memory_store(log)
    catch_all(log, store)
    view = TreeView.load(store, "x")
    # A mask that claims every token is trainable (written past the recorder's validation).
    forged = {
        k: dataclasses.replace(
            n, trainable=np.ones(n.tokens.shape, np.bool_), logprobs=np.full(n.tokens.shape, -1.0, np.float32)
        )
        for k, n in view.nodes.items()
    }
    stored = stored_execution(TreeView("x", forged, view.records))
    assert [n.token_ids[n.trainable].tolist() for n in stored.tokens.nodes] == [[], [10, 11]]
    assert stored.excluded_critique == 2
