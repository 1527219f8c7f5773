"""Admission latency on one execution shaped like the paper's Appendix C case.

Prints the median time of `admit` (J_max = 5 and uncapped) on a 1,347-node, 10-leaf synthetic
execution, and its ratio to a baseline measured in the same run: one Python pass over the nodes.
Run: .venv/bin/python benchmarks/bench_admission.py [--repeats 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from gyre_train import AdmissionConfig, AdmissionTree, admit
from gyre_train.trajectories.testing import synthetic_execution


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def one_pass_over_nodes(parents: list[int], counts: list[int]) -> int:
    total = 0
    for parent, count in zip(parents, counts, strict=True):
        total += count if parent >= 0 else 0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    execution = synthetic_execution(np.random.default_rng(args.seed), num_nodes=1350, num_leaves=10)
    tree = execution.tree
    parents, counts = tree.parents.tolist(), tree.trainable_counts.tolist()
    print(f"tree: {tree.num_nodes} nodes, {len(tree.leaves)} leaves, {sum(counts)} trainable tokens")

    baseline = median_seconds(lambda: one_pass_over_nodes(parents, counts), args.repeats)
    print(f"baseline (one Python pass over the nodes): {baseline * 1e3:.3f} ms")
    build = median_seconds(
        lambda: AdmissionTree(tree.parents, tree.trainable_counts, tree.leaves), args.repeats
    )
    print(
        f"AdmissionTree construction (validation, paths): {build * 1e3:.3f} ms  ({build / baseline:.1f}x baseline)"
    )
    for cap in (5, None):
        config = AdmissionConfig(max_trajectories=cap)
        rng = np.random.default_rng(args.seed)
        elapsed = median_seconds(lambda config=config, rng=rng: admit(tree, config, rng), args.repeats)
        admission = admit(tree, config, np.random.default_rng(args.seed))
        print(
            f"admit J_max={cap}: {elapsed * 1e3:.3f} ms  ({elapsed / baseline:.1f}x baseline), "
            f"{len(admission.trajectories)} trajectories, L_i = {admission.target_count}"
        )


if __name__ == "__main__":
    main()
