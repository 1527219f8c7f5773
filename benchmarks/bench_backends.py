"""Forward-backward tokens per second: Megatron-core at TP=1 and TP=2 against the PyTorch backend.

Every arm loads the same tiny Qwen3 checkpoint (`TINY_QWEN3` at --layers x --hidden, --vocab rows,
written once by the PyTorch backend's `save`) and times pass 2 (`gradient_share`: forward, the
execution-level loss, backward into the accumulated gradients) over the micro-steps of one
synthetic batch (`synthetic_batch`, the same in every arm). Pass 1 runs once, untimed, for the
batch's clip; no update is made, so every pass repeats the same work. A pass's figure is the
batch's packed tokens (`len(step)` summed) over its seconds on rank 0, between two barriers.

Arms, each in its own spawned processes of one torch thread: the PyTorch backend in one process
(the baseline), Megatron with TP=1 in a gloo world of one, and with TP=2 in a gloo world of two
(two processes, two cores). All are built first; then they take turns, one pass at a time (PyTorch,
TP=1, TP=2, PyTorch, ...), the others waiting idle, so that each round's passes see the same load
of the shared cores. The first --warmup rounds are untimed, the next --repeats timed; each arm's
ratio is the median over rounds of its tokens/s over the PyTorch pass's of the same round. No
target is set. The PyTorch backend computes logits at target tokens only and runs the body row by
row; Megatron computes logits at every token of the packed micro-step (docs/streaming-training.md).

    .venv/bin/python benchmarks/bench_backends.py [--layers 4 --hidden 256 --vocab 8192 --repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bars import bar
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.integration.train_stream.gloo

SEED = 17  # the batch's seed: every arm trains on the same micro-steps


@dataclass(frozen=True)
class Arm:
    """One measured mode: a backend and its tensor-parallel size (its processes)."""

    label: str
    backend: str  # "pytorch" or "megatron"
    tp: int = 1


ARMS = (
    Arm("pytorch, 1 process", "pytorch"),
    Arm("megatron tp=1, 1 process", "megatron", 1),
    Arm("megatron tp=2, 2 processes", "megatron", 2),
)


class Turns:
    """Whose pass it is: pass i of arm k runs at ticket i * len(ARMS) + k; -1 until all are built."""

    def __init__(self, context: Any) -> None:
        self.ticket = context.Value("i", -1, lock=False)
        self.changed = context.Condition()

    def wait(self, ticket: int, timeout_s: float) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: self.ticket.value == ticket, timeout=timeout_s):
                raise TimeoutError(f"ticket {ticket} did not come within {timeout_s:.0f} s")

    def advance(self) -> None:
        with self.changed:
            self.ticket.value += 1
            self.changed.notify_all()


@dataclass(frozen=True)
class Job:
    arm: int  # index into ARMS
    checkpoint: str
    vocab_size: int
    passes: int  # warm-up and timed
    groups: int
    budget: int  # tokens per micro-step
    port: int
    timeout_s: float


def take_turns(
    job: Job, backend: Any, rank: int, results: Any, turns: Turns, barrier: Callable[[], object]
) -> None:
    """Pass 1 once (for the clip); then, at each of this arm's turns, pass 2 over the batch."""
    from gyre_train.cells import (
        SyntheticBatchConfig,
        gradient_share,
        merge_shares,
        ratio_share,
        synthetic_batch,
    )
    from gyre_train.objective import LossConfig

    data = SyntheticBatchConfig(
        groups=job.groups, executions=4, max_rows=3, median_length=job.budget / 3,
        max_length=job.budget, token_budget=job.budget, vocab_size=job.vocab_size,
    )  # fmt: skip
    steps, executions = synthetic_batch(SEED, 0, data)
    loss = LossConfig()
    clip = merge_shares([ratio_share(backend, s) for s in steps], executions, loss)
    tokens = sum(len(s) for s in steps)
    results.put(("ready", job.arm, rank, backend.numel, len(steps), tokens))
    for i in range(job.passes):
        turns.wait(i * len(ARMS) + job.arm, job.timeout_s)
        backend.zero_gradients()
        barrier()
        started = time.perf_counter()
        value = sum(gradient_share(backend, step, clip, loss) for step in steps)
        barrier()
        seconds = time.perf_counter() - started
        if rank == 0:
            results.put(("pass", job.arm, i, tokens / seconds, value))
            turns.advance()


def worker(job: Job, rank: int, results: Any, turns: Turns) -> None:
    """One process of one arm: its backend built from the checkpoint, its passes taken in turn."""
    try:
        arm = ARMS[job.arm]
        if arm.backend == "pytorch":
            from gyre_train.backends import ModelSpec, TorchBackend

            backend = TorchBackend(ModelSpec(config={}, model_dir=Path(job.checkpoint)))  # 1 thread
            take_turns(job, backend, rank, results, turns, lambda: None)
        else:
            import torch.distributed as dist

            from gyre_train.backends import MegatronBackend, qwen3_spec
            from tests.integration.train_stream.gloo import gloo_world

            with gloo_world(rank, arm.tp, job.port):
                spec = qwen3_spec(Path(job.checkpoint), max_sequence_length=job.budget)  # 1 thread
                with MegatronBackend(spec, tensor_parallel_size=arm.tp) as megatron:
                    take_turns(job, megatron, rank, results, turns, dist.barrier)
                dist.barrier()  # leave the world together (gloo aborts a rank whose peer is gone)
        results.put(("ok", job.arm, rank))
    except BaseException as exc:
        results.put(("error", job.arm, rank, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None


@dataclass
class Measured:
    """One arm: rank 0's parameters, the batch's micro-steps and tokens, tokens/s of each pass,
    and the batch's loss (the same in every arm, up to float32 rounding: the same work)."""

    numel: int = 0
    micro_steps: int = 0
    tokens: int = 0
    rates: dict[int, float] = field(default_factory=dict)
    loss: float = float("nan")


def measure(jobs: list[Job], progress: Progress, task: Any) -> list[Measured] | str:
    """Start every arm, let them take turns, and collect what they timed (or an error message)."""
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    turns = Turns(context)
    processes = [
        context.Process(
            target=worker, args=(job, rank, results, turns), name=f"bench-{ARMS[job.arm].label}-{rank}"
        )
        for job in jobs
        for rank in range(ARMS[job.arm].tp)
    ]
    measured = [Measured() for _ in jobs]
    ready: set[tuple[int, int]] = set()
    finished: set[tuple[int, int]] = set()
    error = ""
    deadline = time.monotonic() + jobs[0].timeout_s
    try:
        for process in processes:
            process.start()
        while len(finished) < len(processes) and not error:
            if time.monotonic() > deadline:
                error = f"did not finish within {jobs[0].timeout_s:.0f} s"
                break
            try:
                message = results.get(timeout=0.5)
            except queue.Empty:
                dead = [p for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    error = f"{dead[0].name} exited with {dead[0].exitcode}"
                continue
            kind, arm, *rest = message
            if kind == "ready":
                rank, numel, micro_steps, tokens = rest
                ready.add((arm, rank))
                if rank == 0:
                    measured[arm].numel, measured[arm].micro_steps, measured[arm].tokens = (
                        numel,
                        micro_steps,
                        tokens,
                    )
                if len(ready) == len(processes):
                    turns.advance()  # -1 -> 0: the first pass
            elif kind == "pass":
                i, rate, measured[arm].loss = rest
                measured[arm].rates[i] = rate
                progress.advance(task)
            elif kind == "ok":
                finished.add((arm, rest[0]))
            else:
                error = f"{ARMS[arm].label}, rank {rest[0]}: {rest[1]}"
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
    return error or measured


def write_model(folder: Path, layers: int, hidden: int, vocab: int) -> Path:
    """The checkpoint every arm loads: TINY_QWEN3's shape at this size, seeded, save_pretrained."""
    from gyre_train.backends import ModelSpec, TorchBackend
    from gyre_train.cells import TINY_QWEN3

    config = dict(TINY_QWEN3, vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, head_dim=hidden // 4)  # fmt: skip
    return TorchBackend(ModelSpec(config, seed=0)).save(folder)


def spread(xs: list[float], fmt: str = ",.0f", unit: str = "") -> str:
    median, low, high = (format(x, fmt) + unit for x in (statistics.median(xs), min(xs), max(xs)))
    return f"{median} ({low} to {high})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256, help="a multiple of 8 (4 heads, 2 groups)")
    parser.add_argument("--vocab", type=int, default=8192, help="vocabulary rows")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds before them")
    parser.add_argument("--groups", type=int, default=2, help="groups of 4 executions in the batch")
    parser.add_argument("--budget", type=int, default=256, help="tokens per micro-step")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="for the whole run")
    args = parser.parse_args()
    if args.layers < 1 or args.hidden < 8 or args.hidden % 8 or args.vocab < 16:
        parser.error("--layers >= 1, --hidden a positive multiple of 8, --vocab >= 16")
    if args.repeats < 1 or args.warmup < 0 or args.groups < 1 or args.budget < 16:
        parser.error("--repeats >= 1, --warmup >= 0, --groups >= 1, --budget >= 16")

    from gyre_proxy.engines import free_port

    console = Console(width=max(Console().width, 120))
    rounds = args.warmup + args.repeats
    load_before = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="gyre-bench-backends-") as tmp,
        bar(console) as progress,
    ):
        checkpoint = write_model(Path(tmp) / "qwen3", args.layers, args.hidden, args.vocab)
        jobs = [
            Job(k, str(checkpoint), args.vocab, rounds, args.groups, args.budget, free_port(), args.timeout_s)
            for k in range(len(ARMS))
        ]
        task = progress.add_task("passes, arms in turn", total=rounds * len(ARMS))
        outcome = measure(jobs, progress, task)
    if isinstance(outcome, str):
        console.print(f"[red]failed: {outcome}[/red]")
        raise SystemExit(1)
    timed = range(args.warmup, rounds)
    rates = [[m.rates[i] for i in timed] for m in outcome]
    base = rates[0]
    table = Table(
        title=(
            f"Pass 2 (forward-backward) tokens/s: Qwen3 {args.layers} layers x {args.hidden}, vocabulary "
            f"{args.vocab:,}; a pass is {outcome[0].micro_steps} micro-steps, {outcome[0].tokens:,} tokens; "
            f"{args.repeats} timed rounds after {args.warmup} warm-up; one torch thread per process"
        ),
        caption="ratio: median over rounds of the arm's tokens/s over the PyTorch pass's in the same round",
    )
    table.add_column("mode")
    table.add_column("parameters (rank 0)", justify="right")
    table.add_column("batch loss", justify="right")
    table.add_column("tokens/s: median (range)", justify="right")
    table.add_column("ratio to PyTorch: median (range)", justify="right")
    ratios = []
    for arm, m, xs in zip(ARMS, outcome, rates, strict=True):
        ratios.append([x / b for x, b in zip(xs, base, strict=True)])
        ratio = "baseline" if arm is ARMS[0] else spread(ratios[-1], ".2f", "x")
        table.add_row(arm.label, f"{m.numel / 1e6:.2f}M", f"{m.loss:.6g}", spread(xs), ratio)
    console.print(table)
    console.print(f"load average (1 min): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    for arm, xs, rs in zip(ARMS, rates, ratios, strict=True):
        if arm.backend == "megatron":
            console.print(
                f"forward-backward tokens/s, {arm.label}: {statistics.median(xs):,.0f}; "
                f"/ pytorch, 1 process ({statistics.median(base):,.0f}): {statistics.median(rs):.2f}x"
            )


if __name__ == "__main__":
    main()
