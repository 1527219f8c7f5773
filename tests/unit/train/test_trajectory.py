from __future__ import annotations

import numpy as np
import pytest

from gyre_train import (
    AdmissionTree,
    CandidateLeaf,
    ExecutionTokens,
    GyreTrainError,
    InvalidLeafError,
    InvalidTreeError,
    LeafClass,
    NodeTokens,
)


def _leaf(node: int) -> CandidateLeaf:
    return CandidateLeaf(node, LeafClass.MAIN)


def test_paths_run_root_to_leaf_over_several_roots() -> None:
    tree = AdmissionTree.build([None, 0, 1, None, 3, 1], [0, 1, 2, 0, 4, 5], [_leaf(2), _leaf(4), _leaf(5)])
    assert [p.tolist() for p in tree.paths] == [[0, 1, 2], [3, 4], [0, 1, 5]]
    assert tree.num_nodes == 6


@pytest.mark.parametrize(
    ("parents", "counts", "message"),
    [
        ([None, 1], [0, 0], "node 1 has parent 1"),
        ([None, 2, 0], [0, 0, 0], "node 1 has parent 2"),
        ([None, -5], [0, 0], "node 1 has parent -5"),
        ([None, 0], [0, -1], "negative trainable count"),
        ([None, 0], [0], "one length"),
    ],
)
def test_bad_topology_is_refused(parents: list[int | None], counts: list[int], message: str) -> None:
    with pytest.raises(InvalidTreeError, match=message):
        AdmissionTree.build(parents, counts, [])


@pytest.mark.parametrize("leaves", [[_leaf(2)], [_leaf(-1)], [_leaf(1), _leaf(1)]])
def test_bad_leaves_are_refused(leaves: list[CandidateLeaf]) -> None:
    with pytest.raises(InvalidLeafError):
        AdmissionTree.build([None, 0], [1, 1], leaves)


def test_tree_arrays_are_read_only() -> None:
    tree = AdmissionTree.build([None, 0], [1, 1], [_leaf(1)])
    with pytest.raises(ValueError, match="read-only"):
        tree.trainable_counts[0] = 5
    with pytest.raises(ValueError, match="read-only"):
        tree.paths[0][0] = 1


def test_error_message_starts_with_the_docstring() -> None:
    error = InvalidTreeError("detail")
    assert isinstance(error, GyreTrainError)
    assert str(error) == "The admission tree or its node tokens are inconsistent.: detail"


def test_node_tokens_validate_shapes_and_sampled_logprobs() -> None:
    ids = np.array([1, 2, 3], dtype=np.int32)
    with pytest.raises(InvalidTreeError, match="one shape"):
        NodeTokens(ids, np.array([True, False]), np.zeros(3, dtype=np.float32))
    with pytest.raises(InvalidTreeError, match="behaviour logprob"):
        NodeTokens(ids, np.array([False, True, False]), np.array([0.0, np.nan, 0.0], dtype=np.float32))
    with pytest.raises(InvalidTreeError, match="behaviour logprob"):
        NodeTokens(ids, np.array([False, True, False]), np.array([0.0, 0.5, 0.0], dtype=np.float32))
    with pytest.raises(InvalidTreeError, match="integer"):
        NodeTokens(np.array([1.5]), np.array([False]), np.zeros(1, dtype=np.float32))
    # NaN where a token was not sampled is fine.
    node = NodeTokens(ids, np.array([False, True, False]), np.array([np.nan, -0.5, np.nan], dtype=np.float32))
    assert len(node) == 3


def test_from_tokens_counts_trainable_tokens() -> None:
    nodes = (
        NodeTokens(np.array([1, 2]), np.array([False, False]), np.zeros(2, dtype=np.float32)),
        NodeTokens(np.array([3, 4, 5]), np.array([True, False, True]), np.full(3, -0.1, dtype=np.float32)),
    )
    tree = AdmissionTree.from_tokens([None, 0], ExecutionTokens(nodes), [_leaf(1)])
    assert tree.trainable_counts.tolist() == [0, 2]
    with pytest.raises(InvalidTreeError, match="parents"):
        AdmissionTree.from_tokens([None], ExecutionTokens(nodes), [])
