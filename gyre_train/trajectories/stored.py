"""A stored trajectory tree (gyre_store's TreeView) as admission input: AdmissionTree + ExecutionTokens.

Stored node ids are not in parent-first order (a split puts a new id above an older node), so
nodes are renumbered by their path offset, which strictly grows from parent to child. Targets are
decided by provenance here: only engine-SAMPLED tokens the recorder marked trainable qualify, so
evaluator critique, tool results and injected assistant text are context only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gyre_store.catalog import Provenance
from gyre_store.trees import TreeView
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
        provenance = node.provenance
        sampled = provenance == sampled_code
        recorded = node.trainable if node.trainable is not None else np.zeros(provenance.shape, np.bool_)
        critique += int(np.count_nonzero(provenance == critique_code))
        logprobs = (
            node.logprobs if node.logprobs is not None else np.zeros(provenance.shape, dtype=np.float32)
        )
        nodes.append(NodeTokens(node.tokens, recorded & sampled, logprobs))
    tokens = ExecutionTokens(tuple(nodes))
    leaves = [CandidateLeaf(index[c.leaf], LeafClass(c.leaf_class.value)) for c in view.candidates()]
    tree = AdmissionTree.from_tokens(parents, tokens, leaves)
    return StoredExecution(view.execution_id, tree, tokens, tuple(n.node_id for n in ordered), critique)
