from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_train import (
    Admission,
    AdmissionConfig,
    AdmissionTree,
    CandidateLeaf,
    ClassPriority,
    FlatPriority,
    InvalidConfigError,
    LeafClass,
    admission_rng,
    admit,
)
from tests.unit.train.strategies import admission_trees

CAPS = st.one_of(st.none(), st.integers(1, 6))
SEEDS = st.integers(0, 2**32 - 1)


def _replay(tree: AdmissionTree, admission: Admission, config: AdmissionConfig) -> None:
    """Re-run the masking by hand and check every draw against the rule."""
    remaining = tree.trainable_counts.copy()
    ranks = [config.priority.rank(leaf) for leaf in tree.leaves]
    for draw, trajectory in enumerate(admission.trajectories):
        weights = [int(remaining[p].sum()) for p in tree.paths]
        live = [r for r, w in zip(ranks, weights, strict=True) if r is not None and w > 0]
        assert trajectory.draw == draw
        assert weights[trajectory.leaf_index] > 0
        assert trajectory.rank == ranks[trajectory.leaf_index] == min(live)
        path = tree.paths[trajectory.leaf_index]
        assert trajectory.target_count == weights[trajectory.leaf_index]
        assert set(trajectory.target_nodes) == {int(n) for n in path if remaining[n] > 0}
        remaining[path] = 0
    weights = [int(remaining[p].sum()) for p in tree.paths]
    left = any(r is not None and w > 0 for r, w in zip(ranks, weights, strict=True))
    assert admission.exhausted == (not left)


@settings(max_examples=150)
@given(tree=admission_trees(), cap=CAPS, seed=SEEDS, flat=st.booleans())
def test_every_draw_follows_the_rule(tree: AdmissionTree, cap: int | None, seed: int, flat: bool) -> None:
    config = AdmissionConfig(max_trajectories=cap, priority=FlatPriority() if flat else ClassPriority())
    admission = admit(tree, config, np.random.default_rng(seed))
    _replay(tree, admission, config)
    assert cap is None or len(admission.trajectories) <= cap
    if cap is not None and len(admission.trajectories) < cap:
        assert admission.exhausted


@settings(max_examples=150)
@given(tree=admission_trees(), cap=CAPS, seed=SEEDS)
def test_targets_are_disjoint_trainable_and_on_the_path(
    tree: AdmissionTree, cap: int | None, seed: int
) -> None:
    admission = admit(tree, AdmissionConfig(max_trajectories=cap), np.random.default_rng(seed))
    seen: list[int] = []
    for trajectory in admission.trajectories:
        path = set(tree.paths[trajectory.leaf_index].tolist())
        assert set(trajectory.target_nodes) <= path
        assert all(tree.trainable_counts[n] > 0 for n in trajectory.target_nodes)
        assert trajectory.target_count == int(tree.trainable_counts[list(trajectory.target_nodes)].sum())
        seen.extend(trajectory.target_nodes)
    assert len(seen) == len(set(seen))
    assert admission.target_count == int(tree.trainable_counts[seen].sum())


@settings(max_examples=150)
@given(tree=admission_trees(), seed=SEEDS)
def test_uncapped_admission_covers_every_leaf_path(tree: AdmissionTree, seed: int) -> None:
    admission = admit(tree, AdmissionConfig(max_trajectories=None), np.random.default_rng(seed))
    covered = {n for t in admission.trajectories for n in t.target_nodes}
    wanted = {int(n) for path in tree.paths for n in path if tree.trainable_counts[n] > 0}
    assert covered == wanted
    assert admission.exhausted


@settings(max_examples=60)
@given(tree=admission_trees(), cap=CAPS, seed=SEEDS)
def test_same_seed_same_admission(tree: AdmissionTree, cap: int | None, seed: int) -> None:
    config = AdmissionConfig(max_trajectories=cap)
    assert admit(tree, config, np.random.default_rng(seed)) == admit(
        tree, config, np.random.default_rng(seed)
    )


def _two_disjoint_leaves(first: LeafClass, second: LeafClass, weights: tuple[int, int]) -> AdmissionTree:
    # root 0 (no targets) -> node 1 (leaf A), root 2 -> node 3 (leaf B)
    return AdmissionTree.build(
        [None, 0, None, 2],
        [0, weights[0], 0, weights[1]],
        [CandidateLeaf(1, first), CandidateLeaf(3, second)],
    )


def test_draws_are_proportional_to_unmasked_tokens() -> None:
    tree = _two_disjoint_leaves(LeafClass.MAIN, LeafClass.MAIN, (1, 3))
    rng = np.random.default_rng(7)
    config = AdmissionConfig(max_trajectories=1)
    picks = [admit(tree, config, rng).trajectories[0].leaf_index for _ in range(4000)]
    assert abs(np.mean(picks) - 0.75) < 0.03


def test_main_goes_first_under_the_default_priority_but_not_under_flat() -> None:
    tree = _two_disjoint_leaves(LeafClass.SUB_AGENT, LeafClass.MAIN, (99, 1))
    rng = np.random.default_rng(3)
    default = [admit(tree, AdmissionConfig(max_trajectories=1), rng).trajectories[0] for _ in range(200)]
    assert all(t.leaf_class is LeafClass.MAIN for t in default)
    flat = AdmissionConfig(max_trajectories=1, priority=FlatPriority())
    picks = [admit(tree, flat, rng).trajectories[0].leaf_class for _ in range(200)]
    assert picks.count(LeafClass.SUB_AGENT) > 150


def test_class_order_is_a_parameter_and_omitted_classes_are_never_admitted() -> None:
    tree = _two_disjoint_leaves(LeafClass.SUB_AGENT, LeafClass.MAIN, (5, 5))
    reversed_order = ClassPriority((LeafClass.SUB_AGENT, LeafClass.MAIN))
    admission = admit(tree, AdmissionConfig(priority=reversed_order), np.random.default_rng(0))
    assert [t.leaf_class for t in admission.trajectories] == [LeafClass.SUB_AGENT, LeafClass.MAIN]
    main_only = admit(
        tree, AdmissionConfig(priority=ClassPriority((LeafClass.MAIN,))), np.random.default_rng(0)
    )
    assert [t.leaf_class for t in main_only.trajectories] == [LeafClass.MAIN]
    assert main_only.exhausted


def test_shared_prefix_is_frozen_to_the_first_draw() -> None:
    # 0 -> 1 -> {2, 3}: the second draw only gets its own node.
    tree = AdmissionTree.build(
        [None, 0, 1, 1], [0, 10, 4, 6], [CandidateLeaf(2, LeafClass.MAIN), CandidateLeaf(3, LeafClass.MAIN)]
    )
    admission = admit(tree, AdmissionConfig(), np.random.default_rng(0))
    first, second = admission.trajectories
    assert 1 in first.target_nodes and 1 not in second.target_nodes
    assert second.target_nodes == (second.leaf.node,)
    assert admission.target_count == 20


def test_default_cap_is_five() -> None:
    leaves = [CandidateLeaf(i, LeafClass.MAIN) for i in range(1, 9)]
    tree = AdmissionTree.build([None] + [0] * 8, [0] + [1] * 8, leaves)
    admission = admit(tree, AdmissionConfig(), np.random.default_rng(0))
    assert len(admission.trajectories) == 5 and not admission.exhausted


def test_admission_rng_depends_on_seed_and_execution_only() -> None:
    a = admission_rng(1, "exec-a").random(3)
    assert np.array_equal(a, admission_rng(1, "exec-a").random(3))
    assert not np.array_equal(a, admission_rng(1, "exec-b").random(3))
    assert not np.array_equal(a, admission_rng(2, "exec-a").random(3))


def test_bad_configs_are_refused() -> None:
    with pytest.raises(InvalidConfigError):
        AdmissionConfig(max_trajectories=0)
    with pytest.raises(InvalidConfigError):
        ClassPriority((LeafClass.MAIN, LeafClass.MAIN))

    class Negative:
        def rank(self, leaf: CandidateLeaf) -> int | None:
            return -1

    tree = _two_disjoint_leaves(LeafClass.MAIN, LeafClass.MAIN, (1, 1))
    with pytest.raises(InvalidConfigError):
        admit(tree, AdmissionConfig(priority=Negative()), np.random.default_rng(0))
