from __future__ import annotations

import numpy as np
import pytest

from gyre_train import (
    AdmissionConfig,
    AdmissionTree,
    CandidateLeaf,
    ExecutionRows,
    ExecutionTokens,
    InvalidRowsError,
    InvalidTreeError,
    LeafClass,
    NodeTokens,
    TokenRow,
    admit,
    materialize_rows,
)
from gyre_train.trajectories.testing import synthetic_execution


def _node(ids: list[int], trainable: list[bool]) -> NodeTokens:
    logprobs = np.where(trainable, -0.25, np.nan).astype(np.float32)
    return NodeTokens(np.array(ids, dtype=np.int32), np.array(trainable), logprobs)


def test_rows_carry_full_context_and_only_frozen_targets() -> None:
    # 0 (system) -> 1 (assistant) -> 2 (tool) -> 3 (assistant, leaf A) ; 1 -> 4 (assistant, leaf B) -> 5 (tool)
    nodes = (
        _node([10, 11], [False, False]),
        _node([12, 13], [True, True]),
        _node([14], [False]),
        _node([15, 16, 17], [True, False, True]),
        _node([18, 21], [True, False]),
        _node([19, 20], [False, False]),
    )
    tokens = ExecutionTokens(nodes)
    leaves = [CandidateLeaf(3, LeafClass.MAIN), CandidateLeaf(5, LeafClass.SUB_AGENT)]
    tree = AdmissionTree.from_tokens([None, 0, 1, 2, 1, 4], tokens, leaves)
    admission = admit(tree, AdmissionConfig(), np.random.default_rng(0))
    first, second = materialize_rows("e1", tree, tokens, admission)
    assert first.token_ids.tolist() == [10, 11, 12, 13, 14, 15, 16, 17]
    assert first.target_mask.tolist() == [False, False, True, True, False, True, False, True]
    assert first.behaviour_logprobs.tolist() == [0, 0, -0.25, -0.25, 0, -0.25, 0, -0.25]
    # The second path shares nodes 0-1 (already frozen) and ends in a tool node: trimmed after token 18.
    assert second.token_ids.tolist() == [10, 11, 12, 13, 18]
    assert second.target_mask.tolist() == [False, False, False, False, True]
    assert (first.execution_id, first.trajectory, second.trajectory) == ("e1", 0, 1)
    assert ExecutionRows("e1", 0.5, (first, second)).target_count == admission.target_count == 5


def test_synthetic_rows_match_admission_counts() -> None:
    execution = synthetic_execution(np.random.default_rng(4), num_nodes=200, num_leaves=6)
    admission = admit(execution.tree, AdmissionConfig(max_trajectories=None), np.random.default_rng(1))
    rows = materialize_rows("x", execution.tree, execution.tokens, admission)
    assert [r.target_count for r in rows] == [t.target_count for t in admission.trajectories]
    for row, trajectory in zip(rows, admission.trajectories, strict=True):
        path = execution.tree.paths[trajectory.leaf_index].tolist()
        context = np.concatenate([execution.tokens.nodes[n].token_ids for n in path])
        assert np.array_equal(row.token_ids, context[: len(row)])


def test_mismatched_tokens_are_refused() -> None:
    tokens = ExecutionTokens((_node([1], [False]), _node([2], [True])))
    tree = AdmissionTree.build([None, 0], [0, 2], [CandidateLeaf(1, LeafClass.MAIN)])
    admission = admit(tree, AdmissionConfig(), np.random.default_rng(0))
    with pytest.raises(InvalidTreeError, match="disagree"):
        materialize_rows("e", tree, tokens, admission)
    short = AdmissionTree.build([None], [0], [])
    with pytest.raises(InvalidTreeError, match="token nodes"):
        materialize_rows("e", short, tokens, admission)


def test_a_target_without_context_is_refused() -> None:
    tokens = ExecutionTokens((_node([1, 2], [True, True]),))
    tree = AdmissionTree.from_tokens([None], tokens, [CandidateLeaf(0, LeafClass.MAIN)])
    admission = admit(tree, AdmissionConfig(), np.random.default_rng(0))
    with pytest.raises(InvalidTreeError, match="no context"):
        materialize_rows("e", tree, tokens, admission)


def test_token_row_validation() -> None:
    ids = np.array([1, 2, 3], dtype=np.int32)
    lp = np.full(3, -0.1, dtype=np.float32)
    with pytest.raises(InvalidRowsError, match="no target"):
        TokenRow("e", 0, ids, np.zeros(3, dtype=bool), lp)
    with pytest.raises(InvalidRowsError, match="position 0"):
        TokenRow("e", 0, ids, np.array([True, False, False]), lp)
    with pytest.raises(InvalidRowsError, match="differ"):
        TokenRow("e", 0, ids, np.array([False, True]), lp)
    with pytest.raises(InvalidRowsError, match="logprob"):
        TokenRow("e", 0, ids, np.array([False, True, False]), np.full(3, np.nan, dtype=np.float32))
    row = TokenRow("e", 0, ids, np.array([False, True, False]), lp)
    assert row.behaviour_logprobs.tolist() == pytest.approx([0.0, -0.1, 0.0])
    with pytest.raises(InvalidRowsError, match="filed under"):
        ExecutionRows("other", 1.0, (row,))
    with pytest.raises(InvalidRowsError, match="not finite"):
        ExecutionRows("e", float("nan"), (row,))
