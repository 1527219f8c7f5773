"""Stream packing efficiency: share of micro-step tokens that are real, not padding.

Packs B groups of synthetic rows with long-tailed (log-normal) lengths by first-fit decreasing
into fixed-size micro-steps and compares with a pad-to-longest baseline in the same run: rows in
arrival order, as many per micro-step as fit when each is padded to the longest among them.
Run: .venv/bin/python benchmarks/bench_packing.py [--budget 65536] [--batches 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gyre_train import BatchPacker, PackingConfig
from gyre_train.trajectories.testing import InMemoryGroupSource, synthetic_group


def pad_to_longest(lengths: list[int], budget: int) -> tuple[int, int]:
    """(padded tokens, micro-steps) when consecutive rows share a step padded to its longest row."""
    padded, steps, count, longest = 0, 0, 0, 0
    for length in lengths:
        if count and (count + 1) * max(longest, length) > budget:
            padded, steps, count, longest = padded + count * longest, steps + 1, 0, 0
        count, longest = count + 1, max(longest, length)
    return padded + count * longest, steps + (1 if count else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", type=int, default=65536, help="tokens per micro-step")
    parser.add_argument("--groups", type=int, default=8, help="B")
    parser.add_argument("--executions", type=int, default=16, help="N")
    parser.add_argument("--max-rows", type=int, default=5, help="rows per execution are 0..max")
    parser.add_argument("--median-length", type=float, default=6000.0)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    config = PackingConfig(args.budget, args.groups, args.executions, skip_zero_advantage=False)
    real = packed_slots = baseline_padded = steps_total = baseline_steps = 0
    seconds = 0.0
    for batch in range(args.batches):
        source = InMemoryGroupSource()
        groups = [
            synthetic_group(rng, f"b{batch}g{k}", int(rng.integers(0, 3)), args.executions, args.max_rows,
                            args.median_length, args.budget)
            for k in range(args.groups)
        ]  # fmt: skip
        for group in groups:
            source.put(group)
        start = time.perf_counter()
        steps = BatchPacker(config, batch).pull(source)
        seconds += time.perf_counter() - start
        lengths = [len(r) for g in groups for e in g.executions for r in e.rows]
        padded, count = pad_to_longest(lengths, args.budget)
        real += sum(lengths)
        packed_slots += len(steps) * args.budget
        steps_total += len(steps)
        baseline_padded += padded
        baseline_steps += count
    print(
        f"{args.batches} batches of B={args.groups} x N={args.executions}, budget {args.budget} tokens, "
        f"log-normal row lengths (median {args.median_length:.0f}): {real} real tokens"
    )
    print(
        f"stream packing (FFD, fixed-size micro-steps): {real / packed_slots:.2%} real, {steps_total} micro-steps"
    )
    print(
        f"pad-to-longest baseline:                      {real / baseline_padded:.2%} real, {baseline_steps} micro-steps"
    )
    print(f"packing time: {seconds / args.batches * 1e3:.1f} ms per batch")


if __name__ == "__main__":
    main()
