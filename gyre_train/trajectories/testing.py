"""In-memory implementations and synthetic data for tests, benchmarks and offline ablations.

`InMemoryGroupSource` is the trajectory buffer behind the ReadyGroupSource seam; the synthetic
generators build executions shaped like the paper's Appendix C case (two roots, long shared
prefixes, about ten leaves). Nothing here reads storage or is meant for production traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gyre_train.exceptions import UnknownGroupError
from gyre_train.trajectories.packing import GroupTicket, ReadyGroup
from gyre_train.trajectories.rows import ExecutionRows, TokenRow
from gyre_train.trajectories.trajectory import (
    AdmissionTree,
    CandidateLeaf,
    ExecutionTokens,
    LeafClass,
    NodeTokens,
)


class InMemoryGroupSource:
    """Ready groups held in a list; `take` removes a group, so each is handed out once."""

    def __init__(self) -> None:
        self._tickets: dict[str, GroupTicket] = {}
        self._groups: dict[str, ReadyGroup] = {}
        self._next_seq = 0

    def put(self, group: ReadyGroup) -> None:
        self._tickets[group.group_id] = GroupTicket(group.group_id, group.policy_version, self._next_seq)
        self._groups[group.group_id] = group
        self._next_seq += 1

    def ready_groups(self) -> Sequence[GroupTicket]:
        return tuple(self._tickets.values())

    def take(self, group_id: str) -> ReadyGroup:
        if group_id not in self._groups:
            raise UnknownGroupError(group_id)
        del self._tickets[group_id]
        return self._groups.pop(group_id)


@dataclass(frozen=True, slots=True, eq=False)
class SyntheticExecution:
    """A generated execution: its admission tree, node tokens and parent list."""

    parents: tuple[int | None, ...]
    tree: AdmissionTree
    tokens: ExecutionTokens


def synthetic_execution(
    rng: np.random.Generator,
    num_nodes: int = 1350,
    num_leaves: int = 10,
    num_roots: int = 2,
    mean_node_tokens: float = 60.0,
    vocab_size: int = 1000,
) -> SyntheticExecution:
    """A branching execution: leaves branch off earlier nodes of their root's subtree.

    Nodes at odd depth are sampled assistant turns (all tokens trainable); even depths are
    harness-supplied context. Root 0 holds main leaves, the other roots sub-agent leaves.
    """
    parents: list[int | None] = [None] * num_roots
    depth = [0] * num_roots
    owner = list(range(num_roots))
    leaves: list[CandidateLeaf] = []
    per_leaf = max(1, (num_nodes - num_roots) // max(1, num_leaves))
    for k in range(num_leaves):
        root = k % num_roots
        ends = {leaf.node for leaf in leaves}
        inner = [i for i in range(len(parents)) if owner[i] == root and i not in ends]
        start = inner[0] if len(inner) == 1 else int(rng.choice(inner[: max(1, int(len(inner) * 0.8))]))
        length = per_leaf + (1 if (depth[start] + per_leaf) % 2 == 0 else 0)
        for _ in range(length):
            parents.append(start)
            depth.append(depth[start] + 1)
            owner.append(root)
            start = len(parents) - 1
        summary = bool(rng.random() < 0.3)
        if root == 0:
            leaf_class = LeafClass.MAIN_SUMMARY if summary else LeafClass.MAIN
        else:
            leaf_class = LeafClass.SUB_AGENT_SUMMARY if summary else LeafClass.SUB_AGENT
        leaves.append(CandidateLeaf(start, leaf_class))
    lengths = np.maximum(1, rng.poisson(mean_node_tokens, size=len(parents)))
    nodes = []
    for node, length in enumerate(lengths.tolist()):
        trainable = np.full(length, depth[node] % 2 == 1, dtype=np.bool_)
        logprobs = np.where(trainable, -rng.exponential(0.5, size=length), 0.0).astype(np.float32)
        ids = rng.integers(0, vocab_size, size=length, dtype=np.int32)
        nodes.append(NodeTokens(ids, trainable, logprobs))
    tokens = ExecutionTokens(tuple(nodes))
    return SyntheticExecution(tuple(parents), AdmissionTree.from_tokens(parents, tokens, leaves), tokens)


def synthetic_rows(
    rng: np.random.Generator,
    execution_id: str,
    num_rows: int,
    median_length: float,
    max_length: int,
    vocab_size: int = 1000,
) -> tuple[TokenRow, ...]:
    """Rows with log-normal (long-tailed) lengths; about a third of each row's tokens are targets."""
    rows = []
    lengths = np.clip(rng.lognormal(np.log(median_length), 1.0, size=num_rows), 2, max_length).astype(
        np.int64
    )
    for trajectory, length in enumerate(lengths.tolist()):
        mask = rng.random(length) < 0.33
        mask[0] = False
        mask[-1] = True
        rows.append(
            TokenRow(
                execution_id=execution_id,
                trajectory=trajectory,
                token_ids=rng.integers(0, vocab_size, size=length, dtype=np.int32),
                target_mask=mask,
                behaviour_logprobs=np.where(mask, -rng.exponential(0.5, size=length), 0.0).astype(np.float32),
            )
        )
    return tuple(rows)


def synthetic_group(
    rng: np.random.Generator,
    group_id: str,
    policy_version: int,
    executions: int,
    max_rows: int,
    median_length: float,
    max_length: int,
) -> ReadyGroup:
    """A group of `executions` executions with 0..max_rows rows each and standard-normal advantages."""
    members = []
    for k in range(executions):
        execution_id = f"{group_id}/{k}"
        count = int(rng.integers(0, max_rows + 1))
        rows = synthetic_rows(rng, execution_id, count, median_length, max_length)
        members.append(ExecutionRows(execution_id, float(rng.standard_normal()), rows))
    return ReadyGroup(group_id, policy_version, tuple(members))
