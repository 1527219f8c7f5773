"""Trajectory admission (paper, "Trajectory sampling"): bounded paths by role priority.

Each draw takes the highest-priority class that still has unmasked trainable tokens, picks one
leaf with probability proportional to the unmasked trainable tokens on its root-to-leaf path,
freezes exactly those tokens as its targets and masks the whole path. It works on node counts
only; turning admitted trajectories into token rows is `rows.materialize_rows`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gyre_train.exceptions import InvalidConfigError
from gyre_train.trajectories.trajectory import AdmissionTree, CandidateLeaf, IntArray, LeafClass

CLAUDE_CODE_ORDER: tuple[LeafClass, ...] = (
    LeafClass.MAIN,
    LeafClass.MAIN_SUMMARY,
    LeafClass.SUB_AGENT,
    LeafClass.SUB_AGENT_SUMMARY,
)


class LeafPriority(Protocol):
    """Maps a candidate leaf to its priority rank: lower ranks are drawn first, None never."""

    def rank(self, leaf: CandidateLeaf) -> int | None: ...


@dataclass(frozen=True, slots=True)
class ClassPriority:
    """Rank by position of the leaf's class in `order`; classes left out are never admitted."""

    order: tuple[LeafClass, ...] = CLAUDE_CODE_ORDER

    def __post_init__(self) -> None:
        if len(set(self.order)) != len(self.order):
            raise InvalidConfigError(f"class order lists a class twice: {self.order}")

    def rank(self, leaf: CandidateLeaf) -> int | None:
        return self.order.index(leaf.leaf_class) if leaf.leaf_class in self.order else None


@dataclass(frozen=True, slots=True)
class FlatPriority:
    """Every leaf in one class: draws are proportional to unmasked tokens alone (an ablation)."""

    def rank(self, leaf: CandidateLeaf) -> int | None:
        return 0


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """J_max (None = uncapped) and the role priority; the paper's defaults are 5 and eq. (4)."""

    max_trajectories: int | None = 5
    priority: LeafPriority = field(default_factory=ClassPriority)

    def __post_init__(self) -> None:
        if self.max_trajectories is not None and self.max_trajectories < 1:
            raise InvalidConfigError(f"max_trajectories must be >= 1 or None, got {self.max_trajectories}")


@dataclass(frozen=True, slots=True)
class AdmittedTrajectory:
    """One draw: the leaf, its priority rank, and its frozen targets.

    Every trainable token of each node in `target_nodes` is a target of this trajectory (masking
    is per path, so a node is either wholly frozen to one trajectory or not a target of it).
    """

    draw: int
    leaf_index: int  # index into AdmissionTree.leaves
    leaf: CandidateLeaf
    rank: int
    target_nodes: tuple[int, ...]  # root first, a subset of the leaf's path
    target_count: int  # L_r

    @property
    def leaf_class(self) -> LeafClass:
        return self.leaf.leaf_class


@dataclass(frozen=True, slots=True)
class Admission:
    """The admitted trajectory set R_i of one execution, in draw order."""

    trajectories: tuple[AdmittedTrajectory, ...]
    exhausted: bool  # True when no eligible unmasked trainable token was left at the end

    @property
    def target_count(self) -> int:
        """L_i: the number of distinct targets over all admitted trajectories."""
        return sum(t.target_count for t in self.trajectories)


def admission_rng(seed: int, execution_id: str) -> np.random.Generator:
    """A generator that depends only on the run seed and the execution id (stable across processes)."""
    digest = int.from_bytes(hashlib.blake2b(execution_id.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng([seed, digest])


def admit(tree: AdmissionTree, config: AdmissionConfig, rng: np.random.Generator) -> Admission:
    """Admit at most J_max trajectories of one execution.

    Consumes one `rng.random()` per draw, so a seeded generator reproduces the admission exactly.
    Raises InvalidConfigError when the priority returns a negative rank.
    """
    remaining: IntArray = tree.trainable_counts.copy()  # [n] unmasked trainable tokens per node
    by_rank: dict[int, list[int]] = {}
    for index, leaf in enumerate(tree.leaves):
        rank = config.priority.rank(leaf)
        if rank is None:
            continue
        if rank < 0:
            raise InvalidConfigError(f"priority rank must be >= 0, got {rank} for {leaf}")
        by_rank.setdefault(rank, []).append(index)
    cap = config.max_trajectories
    admitted: list[AdmittedTrajectory] = []
    # Counts only ever fall, so a class found empty stays empty: walk the ranks once.
    for rank in sorted(by_rank):
        members = by_rank[rank]
        while cap is None or len(admitted) < cap:
            weights = np.array([remaining[tree.paths[i]].sum() for i in members], dtype=np.int64)
            total = int(weights.sum())
            if total == 0:
                break
            cumulative = np.cumsum(weights)
            pick = int(np.searchsorted(cumulative, rng.random() * total, side="right"))
            # rng.random() < 1, but the product can round up to `total`; fall back to the last
            # leaf that still has weight so a zero-weight leaf is never drawn.
            pick = min(pick, int(np.flatnonzero(weights)[-1]))
            leaf_index = members[pick]
            path = tree.paths[leaf_index]
            on_path = remaining[path]  # [depth]
            admitted.append(
                AdmittedTrajectory(
                    draw=len(admitted),
                    leaf_index=leaf_index,
                    leaf=tree.leaves[leaf_index],
                    rank=rank,
                    target_nodes=tuple(path[on_path > 0].tolist()),
                    target_count=int(on_path.sum()),
                )
            )
            remaining[path] = 0
        if cap is not None and len(admitted) >= cap:
            break
    eligible = [i for members in by_rank.values() for i in members]
    exhausted = all(int(remaining[tree.paths[i]].sum()) == 0 for i in eligible)
    return Admission(trajectories=tuple(admitted), exhausted=exhausted)
