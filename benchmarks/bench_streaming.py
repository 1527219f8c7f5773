"""Streaming training on CPU processes against a plain single-process loop over the same micro-steps.

Prints, as ratios from one run: batch time with 1, 2 and 3 cells (satellites joining at the first
claim, and mid-batch) against the plain loop, and the Redis claim round trip per micro-step
against the micro-step's compute time. Batch time is measured from the core opening a batch to
its update (process start-up excluded); the first batch is a warm-up and is not counted.

    .venv/bin/python benchmarks/bench_streaming.py [--batches 3 --groups 4 --hidden 128]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
import uuid

import redis

from gyre_proxy.engines.refengine import free_port
from gyre_train.backends import ModelSpec, TorchBackend
from gyre_train.cells import (
    TINY_QWEN3,
    BurstPlan,
    CellCluster,
    ExecutionTotals,
    QueueConfig,
    RedisBatchBoard,
    RedisMicroStepQueue,
    SyntheticBatchConfig,
    cell_configs,
    enqueue_batch,
    gradient_share,
    merge_shares,
    ratio_share,
    synthetic_batch,
    train_batch_locally,
)
from gyre_train.objective import LossConfig
from gyre_train.trajectories import MicroStep

Batch = tuple[list[MicroStep], tuple[ExecutionTotals, ...]]


def plain_loop(spec: ModelSpec, batches: list[Batch], warmup: int = 1) -> float:
    backend = TorchBackend(spec)
    times = []
    for steps, executions in batches:
        started = time.perf_counter()
        train_batch_locally(backend, steps, executions, LossConfig())
        times.append(time.perf_counter() - started)
    return statistics.mean(times[warmup:])


def streaming(spec: ModelSpec, batches: list[Batch], cells: int, join_at: float, redis_url: str) -> float:
    prefix = f"gyre:bench:{uuid.uuid4().hex[:10]}"
    configs = cell_configs(cells=cells, redis_url=redis_url, port=free_port(), model=spec, prefix=prefix)
    client = redis.Redis.from_url(redis_url)
    board = RedisBatchBoard(client, configs[0].queue)
    joins = {s: (0, int(join_at * len(batches[0][0]))) for s in range(1, cells)}
    times = []
    if join_at > 0:  # one burst per batch: satellites rejoin every batch mid-way and pull weights
        bursts = [BurstPlan(batches=(b,), joins=joins) for b in range(len(batches))]
    else:
        bursts = [BurstPlan(batches=tuple(range(len(batches))), joins=joins)]
    try:
        with CellCluster(configs, bursts) as cluster:
            for b, (steps, executions) in enumerate(batches):
                enqueue_batch(RedisMicroStepQueue(client, configs[0].queue, b), steps, executions)
            for b in range(len(batches)):
                while board.opened(b) is None:
                    time.sleep(0.0005)
                opened = time.perf_counter()
                while board.updated(b) is None:
                    time.sleep(0.0005)
                times.append(time.perf_counter() - opened)
            cluster.wait(timeout_s=300)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()
    return statistics.mean(times[1:])


def claim_overhead(spec: ModelSpec, batch: Batch, redis_url: str) -> tuple[float, float]:
    """Seconds per micro-step: claim + renew + ack on Redis, and both passes of compute."""
    steps, executions = batch
    client = redis.Redis.from_url(redis_url)
    prefix = f"gyre:bench:{uuid.uuid4().hex[:10]}"
    queue = RedisMicroStepQueue(client, QueueConfig(prefix), 0)
    enqueue_batch(queue, steps, executions)
    started = time.perf_counter()
    while (task := queue.claim(0)) is not None:
        queue.renew(0, [task.message_id])
        queue.ack([task.message_id])
    redis_s = (time.perf_counter() - started) / len(steps)
    queue.delete()
    client.close()
    backend = TorchBackend(spec)
    started = time.perf_counter()
    clip = merge_shares([ratio_share(backend, s) for s in steps], executions, LossConfig())
    for step in steps:
        gradient_share(backend, step, clip, LossConfig())
    compute_s = (time.perf_counter() - started) / len(steps)
    return redis_s, compute_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=int(os.environ.get("GYRE_BENCH_BATCHES", "3")))
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--executions", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--token-budget", type=int, default=256)
    parser.add_argument("--redis-url", default=os.environ.get("GYRE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()

    config = dict(TINY_QWEN3, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                  num_hidden_layers=args.layers, head_dim=args.hidden // 4)  # fmt: skip
    spec = ModelSpec(config, seed=0)
    data = dataclasses.replace(
        SyntheticBatchConfig(), groups=args.groups, executions=args.executions, max_rows=3,
        median_length=args.token_budget / 3, max_length=args.token_budget, token_budget=args.token_budget,
    )  # fmt: skip
    batches = [synthetic_batch(0, b, data) for b in range(args.batches)]
    print(f"model: {config['num_hidden_layers']} layers, hidden {config['hidden_size']}; "
          f"{len(batches[0][0])} micro-steps of <= {args.token_budget} tokens per batch; {os.cpu_count()} CPU cores")  # fmt: skip
    base = plain_loop(spec, batches)
    print(f"plain single-process loop:          {base * 1000:8.1f} ms per batch  (1.00x)")
    for cells, join_at, label in ((1, 0.0, "1 cell (core only)"), (2, 0.0, "2 cells, satellite from the start"),
                                  (2, 0.5, "2 cells, satellite joins mid-batch"), (3, 0.0, "3 cells from the start")):  # fmt: skip
        seconds = streaming(spec, batches, cells, join_at, args.redis_url)
        print(f"{label + ':':35s} {seconds * 1000:8.1f} ms per batch  ({seconds / base:.2f}x the plain loop)")
    redis_s, compute_s = claim_overhead(spec, batches[0], args.redis_url)
    print(f"Redis claim+renew+ack per micro-step: {redis_s * 1e3:.3f} ms; compute (both passes) "
          f"{compute_s * 1e3:.2f} ms; overhead {redis_s / compute_s:.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
