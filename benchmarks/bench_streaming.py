"""Streaming training on CPU processes against a plain single-process loop over the same micro-steps.

Prints, as ratios from one run: batch time with 1, 2 and 3 cells (satellites joining at the first
claim, and mid-batch) against the plain loop, and the cost of a claim per micro-step (Redis claim,
renew and acknowledgement, and the claim event appended to PostgreSQL) against the micro-step's
compute. The cells write their events (claims, contributions, updates, role changes) to a scratch
PostgreSQL database as in production; the benchmark counts them afterwards. Both arms time a batch
over the same window: from the end of the previous batch's update to the end of this one's (for
the cells, the board's `updated` mark seen by this process; so the work a cell does between two
batches is inside, process start-up is not); the first batch is a warm-up, the next --batches (at
least 10) are timed, and each figure is the median with its range. Each mode is compared with the
plain loop run just before it (the load of shared cores drifts).

    .venv/bin/python benchmarks/bench_streaming.py [--batches 10 --groups 4 --hidden 128] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import time
import uuid

import psycopg
import redis
from rich.console import Console
from rich.progress import Progress
from scratch import scratch_database

from gyre_proxy.engines.refengine import free_port
from gyre_store import NewEvent, PostgresEventLog, StoreConfig
from gyre_store.catalog import MicroStepClaimed
from gyre_store.log import EventMetadata
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
TARGET_ONE_CELL = 1.10  # one cell's batch time / the plain loop's <=
console = Console()


def spread(xs: list[float], scale: float = 1000.0, fmt: str = ".1f") -> str:
    return f"{format(statistics.median(xs) * scale, fmt)} ({format(min(xs) * scale, fmt)} to {format(max(xs) * scale, fmt)})"


def plain_loop(spec: ModelSpec, batches: list[Batch], progress: Progress, label: str) -> list[float]:
    """Seconds per batch of one process training alone, from the end of the previous batch's update
    to the end of this one's (the first batch is the warm-up)."""
    backend = TorchBackend(spec)
    task = progress.add_task(label, total=len(batches))
    ends = []
    for steps, executions in batches:
        train_batch_locally(backend, steps, executions, LossConfig())
        ends.append(time.perf_counter())
        progress.advance(task)
    return [b - a for a, b in itertools.pairwise(ends)]


def streaming(
    spec: ModelSpec,
    batches: list[Batch],
    cells: int,
    join_at: float,
    redis_url: str,
    database_url: str,
    run_id: str,
    progress: Progress,
    label: str,
) -> tuple[list[float], list[float]]:
    """Seconds per batch from the previous batch's update to this one's, as the plain loop times
    it (the first batch is the warm-up), and the seconds of each timed batch from the core opening
    it to its update (the window this benchmark used before, which leaves out the core's work
    between two batches; printed only to show how much that is)."""
    prefix = f"gyre:bench:{uuid.uuid4().hex[:10]}"
    configs = cell_configs(
        cells=cells, redis_url=redis_url, port=free_port(), model=spec, prefix=prefix,
        run_id=run_id, database_url=database_url,
    )  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    board = RedisBatchBoard(client, configs[0].queue)
    joins = {s: (0, int(join_at * len(batches[0][0]))) for s in range(1, cells)}
    ends: list[float] = []
    inside: list[float] = []
    if join_at > 0:  # one burst per batch: satellites rejoin every batch mid-way and pull weights
        bursts = [BurstPlan(batches=(b,), joins=joins) for b in range(len(batches))]
    else:
        bursts = [BurstPlan(batches=tuple(range(len(batches))), joins=joins)]
    task = progress.add_task(label, total=len(batches))
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
                ends.append(time.perf_counter())
                inside.append(ends[-1] - opened)
                progress.advance(task)
            cluster.wait(timeout_s=300)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()
    return [b - a for a, b in itertools.pairwise(ends)], inside[1:]


def events_of(database_url: str, run_id: str) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT event_type, count(*) FROM gyre_events WHERE run_id = %s GROUP BY event_type", (run_id,)
        ).fetchall()
    return {str(t): int(n) for t, n in rows}


def claim_overhead(
    spec: ModelSpec, batch: Batch, redis_url: str, database_url: str
) -> tuple[float, float, float]:
    """Seconds per micro-step: claim + renew + ack on Redis; the claim event appended to
    PostgreSQL as a cell appends it (one round trip each); both passes of compute."""
    steps, executions = batch
    client = redis.Redis.from_url(redis_url)
    prefix = f"gyre:bench:{uuid.uuid4().hex[:10]}"
    queue = RedisMicroStepQueue(client, QueueConfig(prefix), steps[0].batch)
    enqueue_batch(queue, steps, executions)
    started = time.perf_counter()
    tasks = []
    while (task := queue.claim(0)) is not None:
        queue.renew(0, [task.message_id])
        queue.ack([task.message_id])
        tasks.append(task)
    redis_s = (time.perf_counter() - started) / len(tasks)
    queue.delete()
    client.close()
    meta = EventMetadata(run_id="claim-overhead")
    with PostgresEventLog(StoreConfig(database_url)) as log:
        started = time.perf_counter()
        for task in tasks:
            claimed = MicroStepClaimed(run_id="claim-overhead", batch=queue.batch, micro_step=task.index,
                                       phase=int(task.phase), cell=0, deliveries=task.deliveries)  # fmt: skip
            log.append([NewEvent(claimed, metadata=meta)])
        event_s = (time.perf_counter() - started) / len(tasks)
    backend = TorchBackend(spec)
    started = time.perf_counter()
    clip = merge_shares([ratio_share(backend, s) for s in steps], executions, LossConfig())
    for step in steps:
        gradient_share(backend, step, clip, LossConfig())
    compute_s = (time.perf_counter() - started) / len(steps)
    return redis_s, event_s, compute_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=int(os.environ.get("GYRE_BENCH_BATCHES", "10")),
                        help="timed batches (at least 10); one warm-up batch runs first")  # fmt: skip
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--executions", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--token-budget", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="the plain loop and one cell only")
    parser.add_argument("--redis-url", default=os.environ.get("GYRE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument(
        "--pg", default=os.environ.get("GYRE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    args = parser.parse_args()
    if args.batches < 10:
        parser.error("--batches must be at least 10")

    config = dict(TINY_QWEN3, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                  num_hidden_layers=args.layers, head_dim=args.hidden // 4)  # fmt: skip
    spec = ModelSpec(config, seed=0)
    data = dataclasses.replace(
        SyntheticBatchConfig(), groups=args.groups, executions=args.executions, max_rows=3,
        median_length=args.token_budget / 3, max_length=args.token_budget, token_budget=args.token_budget,
    )  # fmt: skip
    batches = [synthetic_batch(0, b, data) for b in range(args.batches + 1)]
    steps = [len(s) for s, _ in batches[1:]]
    print(f"model: {config['num_hidden_layers']} layers, hidden {config['hidden_size']}; "
          f"{min(steps)} to {max(steps)} micro-steps of <= {args.token_budget} tokens per batch; "
          f"1 warm-up + {args.batches} timed batches; {os.cpu_count()} CPU cores")  # fmt: skip
    modes = [(1, 0.0, "1 cell (core only)")]
    if not args.quick:
        modes += [(2, 0.0, "2 cells, satellite from the start"), (2, 0.5, "2 cells, satellite joins mid-batch"),
                  (3, 0.0, "3 cells from the start")]  # fmt: skip
    # The shared cores' load drifts over minutes, so each mode gets its own baseline: the plain loop
    # over the same batches, run just before it.
    results: list[tuple[str, list[float], list[float], list[float], dict[str, int]]] = []
    with scratch_database(args.pg, "gyre_bench_streaming") as database_url:
        with Progress(console=console) as progress:
            for cells, join_at, label in modes:
                base = plain_loop(spec, batches, progress, f"plain loop, before {label}")
                run_id = f"bench-{cells}c-{int(join_at * 100)}"
                seconds, inside = streaming(spec, batches, cells, join_at, args.redis_url, database_url, run_id,
                                    progress, label)  # fmt: skip
                results.append((label, base, seconds, inside, events_of(database_url, run_id)))
        redis_s, event_s, compute_s = claim_overhead(spec, batches[1], args.redis_url, database_url)

    timed = sum(len(s) for s, _ in batches)
    print(f"\nms per batch, median (min to max) over {args.batches} batches, each mode against the plain "
          f"single-process loop run just before it, both from the end of one batch's update to the end of the "
          f"next's; ratio of the medians (range of the per-batch ratios)")  # fmt: skip
    for label, base, seconds, inside, events in results:
        ratio = statistics.median(seconds) / statistics.median(base)
        ratios = [s / b for s, b in zip(seconds, base, strict=True)]
        line = (
            f"{label + ':':36s} {spread(seconds):>26s} against {spread(base):>26s}  "
            f"{ratio:.2f}x ({min(ratios):.2f} to {max(ratios):.2f})"
        )
        if label.startswith("1 cell"):
            line += f"  target <= {TARGET_ONE_CELL:.2f}: {'MET' if ratio <= TARGET_ONE_CELL else 'MISSED'}"
        else:
            line += "  (no target)"
        print(line)
        between = [s - i for s, i in zip(seconds, inside, strict=True)]
        print(f"{'':36s} of which outside the core's open-to-update window (between batches): "
              f"{spread(between)} ms")  # fmt: skip
        print(f"{'':36s} events in PostgreSQL: {events.get('train.claimed', 0)} claims, "
              f"{events.get('train.contribution', 0)} contributions, {events.get('train.update', 0)} updates "
              f"({sum(events.values())} in all; {timed} micro-steps over all batches)")  # fmt: skip
    print(f"one claim: Redis claim+renew+ack {redis_s * 1e3:.3f} ms ({redis_s / compute_s:.1%} of a micro-step's "
          f"compute), its claim event appended to PostgreSQL {event_s * 1e3:.3f} ms; compute (both passes) "
          f"{compute_s * 1e3:.2f} ms per micro-step; a micro-step is claimed once per pass: "
          f"{2 * (redis_s + event_s) * 1e3:.2f} ms, {2 * (redis_s + event_s) / compute_s:.1%} of its compute")  # fmt: skip


if __name__ == "__main__":
    main()
