"""Storage-independent inputs of admission and materialization: one execution's trajectory tree.

Nodes are dense indices 0..n-1 listed parents first (the order the event log appends them); a
node holds incremental tokens, and a trajectory is a candidate leaf plus its root-to-leaf path.
This module validates shape and consistency; it does not read the event store or decide which
tokens are trainable (the projection maps provenance to the `trainable` mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import numpy.typing as npt

from gyre_train.exceptions import InvalidLeafError, InvalidTreeError

IntArray = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
BoolArray = npt.NDArray[np.bool_]
Float32Array = npt.NDArray[np.float32]


class LeafClass(Enum):
    """Role class of a candidate leaf (paper eq. 4 for the Claude Code harness)."""

    MAIN = "main"
    MAIN_SUMMARY = "main_summary"
    SUB_AGENT = "sub_agent"
    SUB_AGENT_SUMMARY = "sub_agent_summary"


@dataclass(frozen=True, slots=True)
class CandidateLeaf:
    """A node that ends a candidate trajectory, with the role class of its request sequence."""

    node: int
    leaf_class: LeafClass


def _readonly(array: npt.NDArray[np.generic]) -> None:
    array.setflags(write=False)


@dataclass(frozen=True, slots=True, eq=False)
class AdmissionTree:
    """What admission needs of one execution: topology, trainable counts, candidate leaves.

    `parents[k]` is the parent index of node k, or -1 for a root (an execution may have several
    roots); every parent precedes its child. `trainable_counts[k]` is the number of trainable
    (policy-sampled) tokens among node k's incremental tokens. Build it with `build` or
    `from_tokens`; the constructor validates and raises InvalidTreeError / InvalidLeafError.
    """

    parents: IntArray  # [n] int64, -1 = root
    trainable_counts: IntArray  # [n] int64, >= 0
    leaves: tuple[CandidateLeaf, ...]
    paths: tuple[IntArray, ...] = field(init=False, repr=False)  # per leaf: [depth] root first

    def __post_init__(self) -> None:
        parents = np.asarray(self.parents, dtype=np.int64)
        counts = np.asarray(self.trainable_counts, dtype=np.int64)
        if parents.ndim != 1 or counts.shape != parents.shape:
            raise InvalidTreeError(
                f"parents and trainable_counts must be 1-D of one length, got {parents.shape} and {counts.shape}"
            )
        n = parents.shape[0]
        if n and (counts < 0).any():
            raise InvalidTreeError(f"node {int(np.argmax(counts < 0))} has a negative trainable count")
        if n:
            index = np.arange(n, dtype=np.int64)
            bad = (parents < -1) | (parents >= index)
            if bad.any():
                node = int(np.argmax(bad))
                raise InvalidTreeError(
                    f"node {node} has parent {int(parents[node])}; parents must precede children, -1 for a root"
                )
        seen: set[int] = set()
        for leaf in self.leaves:
            if not 0 <= leaf.node < n:
                raise InvalidLeafError(f"leaf node {leaf.node} is outside 0..{n - 1}")
            if leaf.node in seen:
                raise InvalidLeafError(f"leaf node {leaf.node} is listed twice")
            seen.add(leaf.node)
        _readonly(parents)
        _readonly(counts)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "trainable_counts", counts)
        object.__setattr__(self, "leaves", tuple(self.leaves))
        parent_list: list[int] = parents.tolist()
        paths = []
        for leaf in self.leaves:
            walk = [leaf.node]
            while parent_list[walk[-1]] >= 0:
                walk.append(parent_list[walk[-1]])
            path = np.array(walk[::-1], dtype=np.int64)
            _readonly(path)
            paths.append(path)
        object.__setattr__(self, "paths", tuple(paths))

    @property
    def num_nodes(self) -> int:
        return int(self.parents.shape[0])

    @classmethod
    def build(
        cls,
        parents: Sequence[int | None],
        trainable_counts: Sequence[int],
        leaves: Sequence[CandidateLeaf],
    ) -> AdmissionTree:
        """Build from plain sequences; a None parent marks a root."""
        encoded = np.array([-1 if p is None else p for p in parents], dtype=np.int64)
        return cls(encoded, np.asarray(trainable_counts, dtype=np.int64), tuple(leaves))

    @classmethod
    def from_tokens(
        cls, parents: Sequence[int | None], tokens: ExecutionTokens, leaves: Sequence[CandidateLeaf]
    ) -> AdmissionTree:
        """Build with trainable counts taken from the nodes' trainable masks."""
        if len(parents) != len(tokens.nodes):
            raise InvalidTreeError(f"{len(parents)} parents for {len(tokens.nodes)} token nodes")
        return cls.build(parents, tokens.trainable_counts().tolist(), leaves)


@dataclass(frozen=True, slots=True, eq=False)
class NodeTokens:
    """One node's incremental tokens, exactly as recorded (TITO), never re-tokenized.

    `behaviour_logprobs` holds the engine's logprob for sampled tokens; values at non-trainable
    positions are ignored (NaN or 0). Raises InvalidTreeError on inconsistent arrays.
    """

    token_ids: Int32Array  # [n_k] int32
    trainable: BoolArray  # [n_k] bool, True = policy-sampled target candidate
    behaviour_logprobs: Float32Array  # [n_k] float32

    def __post_init__(self) -> None:
        ids = np.asarray(self.token_ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise InvalidTreeError(f"token_ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        ids = ids.astype(np.int32, copy=False)
        trainable = np.asarray(self.trainable, dtype=np.bool_)
        logprobs = np.asarray(self.behaviour_logprobs, dtype=np.float32)
        if trainable.shape != ids.shape or logprobs.shape != ids.shape:
            raise InvalidTreeError(
                f"token_ids {ids.shape}, trainable {trainable.shape} and "
                f"behaviour_logprobs {logprobs.shape} must have one shape"
            )
        sampled = logprobs[trainable]
        if sampled.size and not (np.isfinite(sampled).all() and (sampled <= 0).all()):
            raise InvalidTreeError("a trainable token lacks a finite, non-positive behaviour logprob")
        for array in (ids, trainable, logprobs):
            _readonly(array)
        object.__setattr__(self, "token_ids", ids)
        object.__setattr__(self, "trainable", trainable)
        object.__setattr__(self, "behaviour_logprobs", logprobs)

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True, slots=True, eq=False)
class ExecutionTokens:
    """The token payload of every node of one execution, indexed like AdmissionTree's nodes."""

    nodes: tuple[NodeTokens, ...]

    def trainable_counts(self) -> IntArray:
        return np.array([int(node.trainable.sum()) for node in self.nodes], dtype=np.int64)
