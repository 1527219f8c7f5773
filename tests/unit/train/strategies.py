"""Hypothesis strategies shared by the gyre_train unit tests."""

from __future__ import annotations

from hypothesis import strategies as st

from gyre_train import AdmissionTree, CandidateLeaf, LeafClass


@st.composite
def admission_trees(draw: st.DrawFn, max_nodes: int = 30) -> AdmissionTree:
    """Random forests (parents precede children), trainable counts 0..20, leaves on any nodes."""
    n = draw(st.integers(1, max_nodes))
    parents: list[int | None] = [None]
    for i in range(1, n):
        parents.append(draw(st.one_of(st.none(), st.integers(0, i - 1))))
    counts = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    nodes = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=min(n, 10), unique=True))
    classes = draw(st.lists(st.sampled_from(list(LeafClass)), min_size=len(nodes), max_size=len(nodes)))
    leaves = [CandidateLeaf(node, cls) for node, cls in zip(nodes, classes, strict=True)]
    return AdmissionTree.build(parents, counts, leaves)
