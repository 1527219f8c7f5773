"""Admission from the topology row: the same draws and rows as from the whole tree, fewer reads."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_store import InMemoryEventLog, InMemoryProjectionStore
from gyre_store.trees import TreeTopology, TreeView
from gyre_train.exceptions import InvalidTreeError
from gyre_train.trajectories import (
    AdmissionConfig,
    admission_rng,
    admit,
    admitted_tokens,
    materialize_rows,
    stored_execution,
    stored_topology,
)
from tests.unit.train.runs import catch_all, memory_store, record_trace


class _Reads:
    """Counts the node rows a store hands out; tree node reads fail while ``no_nodes``."""

    def __init__(self, store: InMemoryProjectionStore) -> None:
        self._store = store
        self.nodes_read = 0
        self.no_nodes = False

    def select(self, table: str, column: str, value: object) -> list[dict[str, object]]:
        assert not (self.no_nodes and table == "gyre_tree_nodes"), "admission read the tree's tokens"
        rows = self._store.select(table, column, value)
        self.nodes_read += len(rows) if table == "gyre_tree_nodes" else 0
        return rows

    def select_in(
        self, table: str, column: str, value: object, among: str, keys: list[object]
    ) -> list[dict[str, object]]:
        rows = self._store.select_in(table, column, value, among, keys)
        self.nodes_read += len(rows) if table == "gyre_tree_nodes" else 0
        return rows

    def payloads(self, positions: list[int]) -> dict[int, bytes]:
        assert not self.no_nodes, "admission read the records' token payloads"
        return self._store.payloads(positions)


@pytest.mark.parametrize("cap", [1, 5, None])
def test_topology_admits_and_packs_what_the_whole_tree_does(cap: int | None) -> None:
    log = InMemoryEventLog()
    record_trace(log, "ex", "r", seed=7)  # compactions, a sub-agent and retries
    store = memory_store(log)
    catch_all(log, store)
    config = AdmissionConfig(max_trajectories=cap)
    old = stored_execution(TreeView.load(store, "ex"))
    old_admission = admit(old.tree, config, admission_rng(3, "ex"))
    old_rows = materialize_rows("ex", old.tree, old.tokens, old_admission)

    reads = _Reads(store)
    reads.no_nodes = True
    new = stored_topology(TreeTopology.load(reads, "ex"))  # type: ignore[arg-type]
    np.testing.assert_array_equal(new.tree.parents, old.tree.parents)
    np.testing.assert_array_equal(new.tree.trainable_counts, old.tree.trainable_counts)
    assert new.tree.leaves == old.tree.leaves
    assert new.node_ids.tolist() == list(old.node_ids)
    admission = admit(new.tree, config, admission_rng(3, "ex"))
    assert admission == old_admission
    reads.no_nodes = False
    tokens = admitted_tokens(reads, new, admission)  # type: ignore[arg-type]
    rows = materialize_rows("ex", new.tree, tokens, admission)
    assert len(rows) == len(old_rows) > 0
    for row, expected in zip(rows, old_rows, strict=True):
        np.testing.assert_array_equal(row.token_ids, expected.token_ids)
        np.testing.assert_array_equal(row.target_mask, expected.target_mask)
        np.testing.assert_array_equal(row.behaviour_logprobs, expected.behaviour_logprobs)
    # Only the admitted paths' nodes are read, up to each path's last target.
    on_paths = {
        int(node)
        for t in admission.trajectories
        for node in new.tree.paths[t.leaf_index][
            : list(new.tree.paths[t.leaf_index]).index(t.target_nodes[-1]) + 1
        ]
    }
    assert reads.nodes_read == len(on_paths) == len(tokens)
    if cap == 1:
        assert reads.nodes_read < new.tree.num_nodes


def test_a_node_left_unloaded_is_refused() -> None:
    log = InMemoryEventLog()
    record_trace(log, "ex", "r", seed=7)
    store = memory_store(log)
    catch_all(log, store)
    new = stored_topology(TreeTopology.load(store, "ex"))
    admission = admit(new.tree, AdmissionConfig(max_trajectories=1), admission_rng(0, "ex"))
    tokens = admitted_tokens(store, new, admission)
    first = min(tokens)
    del tokens[first]
    with pytest.raises(InvalidTreeError, match=f"node {first} were not loaded"):
        materialize_rows("ex", new.tree, tokens, admission)
