"""A stored trajectory tree as admission input: AdmissionTree, then tokens.

Two ways in. ``stored_topology`` reads the tree projection's topology row (no token) and
``admitted_tokens`` then loads the nodes of the admitted paths only: the training path.
``stored_execution`` converts a whole loaded TreeView (tokens of every node), for ablations,
exports and tests. Stored node ids are not in parent-first order (a split puts a new id above
an older node), so nodes are renumbered by their path offset, which strictly grows from parent
to child. Targets are decided by provenance here: only engine-SAMPLED tokens the recorder
marked trainable qualify, so evaluator critique, tool results and injected assistant text are
context only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre_store.catalog import Provenance
from gyre_store.projections import ProjectionStore
from gyre_store.trees import TreeNode, TreeTopology, TreeView, resolve_nodes
from gyre_train.trajectories.admission import Admission
from gyre_train.trajectories.trajectory import (
    AdmissionTree,
    CandidateLeaf,
    ExecutionTokens,
    LeafClass,
    NodeTokens,
)


@dataclass(frozen=True, slots=True, eq=False)
class StoredExecution:
    """One execution's tree in admission form, with the stored node id of every dense index."""

    execution_id: str
    tree: AdmissionTree
    tokens: ExecutionTokens
    node_ids: tuple[int, ...]  # dense index -> stored node id
    excluded_critique: int  # CRITIQUE tokens on the tree (context, never targets)

    def trainable_on_candidates(self) -> int:
        """Trainable tokens on the union of all candidate paths (what uncapped admission covers)."""
        on_paths = np.zeros(self.tree.num_nodes, dtype=np.bool_)
        for path in self.tree.paths:
            on_paths[path] = True
        return int(self.tree.trainable_counts[on_paths].sum())


def stored_execution(view: TreeView) -> StoredExecution:
    """Convert a loaded TreeView; leaves are its candidate trajectories (superseded retries are not)."""
    ordered = sorted(view.nodes.values(), key=lambda n: (n.start, n.node_id))
    index = {node.node_id: i for i, node in enumerate(ordered)}
    parents: list[int | None] = []
    nodes: list[NodeTokens] = []
    critique = 0
    # Plain ints: an array compared with an IntEnum member took about 15 us more per call, two calls
    # per node: 40% of converting an Appendix C-sized tree (benchmarks/bench_stored_admission.py).
    sampled_code, critique_code = int(Provenance.SAMPLED), int(Provenance.CRITIQUE)
    for node in ordered:
        parents.append(None if node.parent_id is None else index[node.parent_id])
        critique += int(np.count_nonzero(node.provenance == critique_code))
        nodes.append(_node_tokens(node, sampled_code))
    tokens = ExecutionTokens(tuple(nodes))
    leaves = [CandidateLeaf(index[c.leaf], LeafClass(c.leaf_class.value)) for c in view.candidates()]
    tree = AdmissionTree.from_tokens(parents, tokens, leaves)
    return StoredExecution(view.execution_id, tree, tokens, tuple(n.node_id for n in ordered), critique)


def _node_tokens(node: TreeNode, sampled_code: int) -> NodeTokens:
    provenance = node.provenance
    recorded = node.trainable if node.trainable is not None else np.zeros(provenance.shape, np.bool_)
    logprobs = node.logprobs if node.logprobs is not None else np.zeros(provenance.shape, dtype=np.float32)
    return NodeTokens(node.tokens, recorded & (provenance == sampled_code), logprobs)


@dataclass(frozen=True, slots=True, eq=False)
class StoredTopology:
    """One execution's tree in admission form, from its topology row: no token read."""

    execution_id: str
    tree: AdmissionTree
    node_ids: npt.NDArray[np.int32]  # [n] dense index -> stored node id


def stored_topology(topology: TreeTopology) -> StoredTopology:
    """Renumber parents first; leaves in stored node-id order, as ``stored_execution`` lists them
    (so a seeded admission draws the same trajectories either way)."""
    ids = np.arange(topology.num_nodes, dtype=np.int32)
    order = np.lexsort((ids, topology.starts)).astype(np.int32)  # [n] dense -> stored id
    index = np.empty_like(order)
    index[order] = np.arange(order.shape[0], dtype=np.int32)  # stored id -> dense
    stored_parents = topology.parents[order]
    parents = np.where(stored_parents >= 0, index[np.maximum(stored_parents, 0)], -1)
    leaves = tuple(CandidateLeaf(int(index[node]), LeafClass(cls.value)) for node, cls in topology.leaves)
    tree = AdmissionTree(parents.astype(np.int64), topology.trainable[order].astype(np.int64), leaves)
    return StoredTopology(topology.execution_id, tree, order)


def admitted_tokens(
    store: ProjectionStore, stored: StoredTopology, admission: Admission
) -> dict[int, NodeTokens]:
    """The tokens of the nodes the admitted rows need (each path up to its last target), by
    dense node index, in one read of those nodes only."""
    wanted: set[int] = set()
    for trajectory in admission.trajectories:
        path = stored.tree.paths[trajectory.leaf_index]
        last = max(int(np.flatnonzero(path == node)[0]) for node in trajectory.target_nodes)
        wanted.update(path[: last + 1].tolist())
    if not wanted:
        return {}
    index = {int(stored.node_ids[i]): i for i in wanted}
    rows = store.select_in("gyre_tree_nodes", "execution_id", stored.execution_id, "node_id", sorted(index))
    sampled_code = int(Provenance.SAMPLED)
    return {index[n.node_id]: _node_tokens(n, sampled_code) for n in resolve_nodes(store, rows)}
