"""A satellite pulling the core's weights: Mooncake Transfer Engine against torch.distributed.

Two real processes per transport, a core and a satellite, on 127.0.0.1. The core holds the state
dict of a small MLP of float32 tensors (4, 32 and 128 MB by default), flattens it and exposes it
through the transport; the satellite times `pull` into its own flat buffer, the way a cell joining
a batch in flight does (cells.py), and checks every pull against the expected values. Compared:

* `MooncakeTransport`: a one-sided `transfer_sync_read` of the core's registered buffer (Transfer
  Engine, P2P handshake, TCP on loopback); the core does nothing during the pull.
* `TorchDistributedTransport`: the satellite asks on the board and the core, polling `serve()`,
  answers with a gloo point-to-point send (the transport's fallback path; it is not a collective).

Each size is pulled `--warmup` times untimed (Mooncake's handshake and memory registration happen
there), then `--repeats` times; the table shows the medians and torch / mooncake. The board is the
run's Redis (`GYRE_REDIS_URL`, default redis://127.0.0.1:6379/0; only 127.0.0.1 or a Unix socket).
Without an importable `mooncake.engine`, only torch.distributed is measured.

    .venv/bin/python benchmarks/bench_weight_pull.py [--sizes-mb 4 32 128 --repeats 5 --warmup 2]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import multiprocessing
import os
import queue
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import redis
import torch
import torch.distributed as dist
from bars import bar
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gyre_train.cells import (
    MooncakeTransport,
    QueueConfig,
    RedisBatchBoard,
    TorchDistributedTransport,
    WeightTransport,
)

HOST = "127.0.0.1"
CORE, SATELLITE = 0, 1
HIDDEN = 512  # the MLP's width; layers are added until the state dict reaches the size asked for


@dataclass(frozen=True)
class Job:
    transport: str  # "torch" or "mooncake"
    sizes_mb: tuple[int, ...]
    warmup: int
    repeats: int
    redis_url: str
    prefix: str
    store_path: str  # the FileStore of the torch.distributed rendezvous
    timeout_s: float


def state_dict(size_mb: int, seed: int) -> dict[str, torch.Tensor]:
    """A small MLP's float32 state dict of `size_mb` MiB (HIDDEN x HIDDEN layers with biases)."""
    numel = size_mb * 2**20 // 4
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    layer = 0
    while numel > 0:
        weight = min(numel, HIDDEN * HIDDEN)
        tensors[f"layers.{layer}.weight"] = torch.randn(weight, generator=generator).reshape(-1, HIDDEN)
        numel -= weight
        bias = min(numel, HIDDEN)
        if bias:
            tensors[f"layers.{layer}.bias"] = torch.randn(bias, generator=generator)
            numel -= bias
        layer += 1
    return tensors


def flatten(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors.values()])


def version_of(size_index: int, attempt: int) -> int:
    return 1000 * (size_index + 1) + attempt


def make(job: Job, board: RedisBatchBoard, cell: int) -> WeightTransport:
    if job.transport == "mooncake":
        return MooncakeTransport(board, cell, host=HOST, protocol="tcp")
    return TorchDistributedTransport(board, cell, core=CORE)


def _wait(predicate: Any, what: str, deadline: float, poll_s: float = 0.0002) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(poll_s)


def run_core(job: Job, client: redis.Redis, transport: WeightTransport) -> None:
    """Expose each (size, attempt) snapshot and serve pulls until the satellite says it has it."""
    done_key = f"{job.prefix}:bench:done"
    deadline = time.monotonic() + job.timeout_s
    for i, size in enumerate(job.sizes_mb):
        flat = flatten(state_dict(size, seed=size))
        for attempt in range(job.warmup + job.repeats):
            version = version_of(i, attempt)
            transport.expose(flat, version)

            def pulled(version: int = version) -> bool:
                transport.serve()  # torch: answer the pull between two "micro-steps"; mooncake: 0
                return int(client.get(done_key) or 0) == version

            _wait(pulled, f"the satellite to pull version {version}", deadline)
        del flat


def run_satellite(
    job: Job, client: redis.Redis, board: RedisBatchBoard, transport: WeightTransport, results: Any
) -> None:
    """Pull every snapshot; report (size, attempt, seconds) for each, checked against the core's."""
    done_key = f"{job.prefix}:bench:done"
    deadline = time.monotonic() + job.timeout_s
    for i, size in enumerate(job.sizes_mb):
        expected = flatten(state_dict(size, seed=size))
        into = torch.empty_like(expected)
        for attempt in range(job.warmup + job.repeats):
            version = version_of(i, attempt)

            def exposed(version: int = version) -> bool:
                descriptor = board.snapshot()
                return descriptor is not None and descriptor.policy_version == version

            _wait(exposed, f"the core to expose version {version}", deadline)
            into.zero_()
            started = time.perf_counter()
            transport.pull(into, version, timeout_s=job.timeout_s)
            seconds = time.perf_counter() - started
            if not torch.equal(into, expected):
                raise RuntimeError(f"{job.transport}: pulled weights differ from the core's ({size} MB)")
            client.set(done_key, version)
            results.put(("pull", job.transport, size, attempt, seconds))
        del expected, into


def worker(job: Job, cell: int, results: Any) -> None:
    """One process: the core or the satellite of one transport's run."""
    torch.set_num_threads(1)
    # gloo's pair sockets on loopback (by default on the interface of the host name). The
    # rendezvous is a FileStore: a TCPStore would listen on every interface whatever init_method says.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        uses_dist = job.transport == "torch"
        if uses_dist:
            dist.init_process_group(
                "gloo",
                store=dist.FileStore(job.store_path, 2),
                rank=cell,
                world_size=2,
                timeout=datetime.timedelta(seconds=job.timeout_s),
            )
        with contextlib.ExitStack() as stack:
            if uses_dist:
                stack.callback(dist.destroy_process_group)
            client = redis.Redis.from_url(job.redis_url)
            stack.callback(client.close)
            board = RedisBatchBoard(client, QueueConfig(job.prefix))
            transport = make(job, board, cell)
            stack.callback(transport.close)
            if cell == CORE:
                run_core(job, client, transport)
            else:
                run_satellite(job, client, board, transport, results)
        results.put(("ok", job.transport, cell))
    except BaseException as exc:
        results.put(("error", job.transport, cell, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None


def measure(job: Job, progress: Progress, task: Any) -> dict[int, list[float]] | str:
    """Run one transport's core and satellite; the timed pulls per size, or an error message."""
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    processes = [
        context.Process(target=worker, args=(job, cell, results), name=f"bench-{job.transport}-{cell}")
        for cell in (CORE, SATELLITE)
    ]
    times: dict[int, list[float]] = {size: [] for size in job.sizes_mb}
    finished: set[int] = set()
    error = ""
    deadline = time.monotonic() + job.timeout_s + 60
    try:
        for process in processes:
            process.start()
        while len(finished) < 2 and not error:
            if time.monotonic() > deadline:
                error = f"did not finish within {job.timeout_s + 60:.0f} s"
                break
            try:
                message = results.get(timeout=0.5)
            except queue.Empty:
                dead = [p for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    error = f"{dead[0].name} exited with {dead[0].exitcode}"
                continue
            if message[0] == "pull":
                _, _, size, attempt, seconds = message
                if attempt >= job.warmup:
                    times[size].append(seconds)
                progress.advance(task)
            elif message[0] == "ok":
                finished.add(message[2])
            else:
                error = f"cell {message[2]}: {message[3]}"
        for process in processes:
            process.join(timeout=10)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        client = redis.Redis.from_url(job.redis_url)
        keys = list(client.scan_iter(match=f"{job.prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()
    return error or times


def mooncake_problem() -> str | None:
    try:
        importlib.import_module("mooncake.engine")
    except ImportError as exc:
        return f"{exc}"
    return None


def loopback_redis(url: str) -> str | None:
    """Why `url` is not a usable Redis on 127.0.0.1 (or a Unix socket), or None."""
    parsed = urlparse(url)
    if parsed.scheme not in ("unix", "redis") or (parsed.scheme == "redis" and parsed.hostname != HOST):
        return f"{url} is not a Redis on {HOST} or a Unix socket"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        return f"no Redis at {url}: {exc}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[4, 32, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--redis-url", default=os.environ.get("GYRE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    console = Console()
    if problem := loopback_redis(args.redis_url):
        console.print(f"[red]The snapshot board needs Redis: {problem}[/red]")
        raise SystemExit(2)
    transports = ["torch"]
    if problem := mooncake_problem():
        console.print(
            f"[yellow]Mooncake is not importable ({problem}); measuring torch.distributed only. "
            "Install mooncake-transfer-engine-non-cuda (pip) and libibverbs1 (apt) to compare.[/yellow]"
        )
    else:
        transports.insert(0, "mooncake")
    sizes = tuple(args.sizes_mb)
    medians: dict[str, dict[int, float]] = {}
    errors: dict[str, str] = {}
    pulls = len(sizes) * (args.warmup + args.repeats)
    with (
        tempfile.TemporaryDirectory(prefix="gyre-bench-pull-") as scratch,
        bar(console) as progress,
    ):
        for name in transports:
            task = progress.add_task(f"{name:>8} pulls", total=pulls)
            job = Job(
                transport=name,
                sizes_mb=sizes,
                warmup=args.warmup,
                repeats=args.repeats,
                redis_url=args.redis_url,
                prefix=f"gyre:bench:pull:{uuid.uuid4().hex[:10]}",
                store_path=os.path.join(scratch, f"{name}.store"),
                timeout_s=args.timeout_s,
            )
            outcome = measure(job, progress, task)
            if isinstance(outcome, str):
                errors[name] = outcome
                continue
            medians[name] = {size: statistics.median(ts) for size, ts in outcome.items() if ts}
    for name, message in errors.items():
        console.print(f"[red]{name} failed: {message}[/red]")

    table = Table(
        title=f"Weight pull on {HOST}: median of {args.repeats} after {args.warmup} warm-up",
        caption="torch/mooncake above 1x: Mooncake pulls faster",
    )
    table.add_column("state dict", justify="right")
    table.add_column("mooncake TCP", justify="right")
    table.add_column("torch gloo", justify="right")
    table.add_column("torch/mooncake", justify="right")
    for size in sizes:
        moon = medians.get("mooncake", {}).get(size)
        torch_s = medians.get("torch", {}).get(size)
        cells = []
        for seconds in (moon, torch_s):
            cells.append(
                "-" if seconds is None else f"{seconds * 1e3:.1f} ms, {size / seconds / 1024:.2f} GiB/s"
            )
        ratio = "-" if moon is None or torch_s is None else f"{torch_s / moon:.2f}x"
        table.add_row(f"{size} MiB", *cells, ratio)
    console.print(table)
    if errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
