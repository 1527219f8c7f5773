"""Materialize admitted trajectories into token rows: a root-to-leaf path, flattened.

A row is the full conditioning context of one trajectory with its frozen targets marked. Tokens
after the row's last target are dropped: under causal attention they influence no target, so the
loss is unchanged. This module copies recorded token ids; it never tokenizes and never reads storage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gyre_train.exceptions import InvalidRowsError, InvalidTreeError
from gyre_train.trajectories.admission import Admission
from gyre_train.trajectories.trajectory import (
    AdmissionTree,
    BoolArray,
    ExecutionTokens,
    Float32Array,
    Int32Array,
    NodeTokens,
)


@dataclass(frozen=True, slots=True, eq=False)
class TokenRow:
    """One trajectory as one training sequence.

    `target_mask[k]` marks token k as a target: its logprob is read from the logits at k-1 of the
    same row, so position 0 is never a target. `behaviour_logprobs` is 0 at non-targets.
    Raises InvalidRowsError on inconsistent arrays or a row without targets.
    """

    execution_id: str
    trajectory: int  # draw index within the execution
    token_ids: Int32Array  # [n] int32
    target_mask: BoolArray  # [n] bool
    behaviour_logprobs: Float32Array  # [n] float32

    def __post_init__(self) -> None:
        ids = np.asarray(self.token_ids, dtype=np.int32)
        mask = np.asarray(self.target_mask, dtype=np.bool_)
        recorded = np.asarray(self.behaviour_logprobs, dtype=np.float32)
        if ids.ndim != 1 or mask.shape != ids.shape or recorded.shape != ids.shape:
            raise InvalidRowsError(
                f"row {self.execution_id}/{self.trajectory}: token_ids {ids.shape}, target_mask "
                f"{mask.shape} and behaviour_logprobs {recorded.shape} differ"
            )
        logprobs = np.where(mask, recorded, np.float32(0)).astype(np.float32)
        if not mask.any():
            raise InvalidRowsError(f"row {self.execution_id}/{self.trajectory} has no target")
        if mask[0]:
            raise InvalidRowsError(f"row {self.execution_id}/{self.trajectory}: position 0 has no context")
        if not (np.isfinite(logprobs).all() and (logprobs <= 0).all()):
            raise InvalidRowsError(f"row {self.execution_id}/{self.trajectory}: bad behaviour logprob")
        for array in (ids, mask, logprobs):
            array.setflags(write=False)
        object.__setattr__(self, "token_ids", ids)
        object.__setattr__(self, "target_mask", mask)
        object.__setattr__(self, "behaviour_logprobs", logprobs)

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def target_count(self) -> int:
        return int(self.target_mask.sum())


@dataclass(frozen=True, slots=True)
class ExecutionRows:
    """One execution ready for the loss: its group-relative advantage and its rows.

    An execution with no rows (placeholder, excluded, nothing trainable) has L_i = 0 and adds zero
    loss, but still counts in the batch denominator B*N.
    """

    execution_id: str
    advantage: float
    rows: tuple[TokenRow, ...]

    def __post_init__(self) -> None:
        if not np.isfinite(self.advantage):
            raise InvalidRowsError(f"execution {self.execution_id}: advantage {self.advantage} is not finite")
        for row in self.rows:
            if row.execution_id != self.execution_id:
                raise InvalidRowsError(f"row of {row.execution_id} filed under {self.execution_id}")

    @property
    def target_count(self) -> int:
        """L_i, summed over rows; admission makes the rows' target sets disjoint."""
        return sum(row.target_count for row in self.rows)


def materialize_rows(
    execution_id: str,
    tree: AdmissionTree,
    tokens: ExecutionTokens | Mapping[int, NodeTokens],
    admission: Admission,
) -> tuple[TokenRow, ...]:
    """Flatten each admitted trajectory's path into a TokenRow, in draw order.

    ``tokens`` holds every node (ExecutionTokens) or only the nodes the rows need, by node
    index (what ``stored.admitted_tokens`` loads). Raises InvalidTreeError when they do not
    match `tree` (node count, trainable counts, a node not loaded) or when a target would sit
    at the first position of a path.
    """
    if isinstance(tokens, ExecutionTokens):
        if len(tokens.nodes) != tree.num_nodes:
            raise InvalidTreeError(f"{len(tokens.nodes)} token nodes for a tree of {tree.num_nodes}")
        if not np.array_equal(tokens.trainable_counts(), tree.trainable_counts):
            raise InvalidTreeError(
                "trainable masks of the token nodes disagree with the tree's trainable counts"
            )
        loaded: Mapping[int, NodeTokens] = dict(enumerate(tokens.nodes))
    else:
        loaded = tokens
    rows = []
    for trajectory in admission.trajectories:
        path = tree.paths[trajectory.leaf_index].tolist()
        targets = set(trajectory.target_nodes)
        last = max(i for i, node in enumerate(path) if node in targets)
        kept = [_loaded(tree, loaded, node) for node in path[: last + 1]]
        masks = [
            node.trainable if index in targets else np.zeros(len(node), dtype=np.bool_)
            for index, node in zip(path, kept, strict=False)
        ]
        mask = np.concatenate(masks)  # [n]
        # Drop tokens after the last target: causal attention lets them reach no target.
        end = int(np.flatnonzero(mask)[-1]) + 1
        if mask[0]:
            raise InvalidTreeError(
                f"node {path[0]} begins a path with a trainable token, which has no context"
            )
        rows.append(
            TokenRow(
                execution_id=execution_id,
                trajectory=trajectory.draw,
                token_ids=np.concatenate([node.token_ids for node in kept])[:end],
                target_mask=mask[:end],
                behaviour_logprobs=np.concatenate([node.behaviour_logprobs for node in kept])[:end],
            )
        )
    return tuple(rows)


def _loaded(tree: AdmissionTree, loaded: Mapping[int, NodeTokens], index: int) -> NodeTokens:
    node = loaded.get(index)
    if node is None:
        raise InvalidTreeError(f"the tokens of node {index} were not loaded")
    if int(np.count_nonzero(node.trainable)) != int(tree.trainable_counts[index]):
        raise InvalidTreeError(
            f"trainable masks of the token nodes disagree with the tree's trainable counts (node {index})"
        )
    return node
