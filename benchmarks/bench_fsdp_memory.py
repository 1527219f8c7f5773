"""Peak resident memory per rank: an FSDP cell of two gloo ranks against one unsharded process.

Each side is spawned fresh, builds the same Qwen3 (about 80M parameters unless --hidden/--layers
say otherwise), trains --steps batches of synthetic micro-steps with AdamW and reports its peak
resident set (the kernel's high-water mark of the process's own memory, VmHWM in
/proc/self/status; getrusage's ru_maxrss, read before, also keeps the resident set of the
parent at the fork that started the side, which set a floor under every side). An idle process that only imports torch and transformers
is the baseline, measured in the same run: it is printed, and subtracted for the second ratio.
Target: FSDP's largest rank at most 0.6x the unsharded process (weights, gradients and the two
AdamW moments are split in two; the imports, the model built whole once before sharding and a
gathered layer are not). Prints MET or MISSED with the figures, in two modes of glibc's
allocator, each with its own baseline and unsharded process:
  default: as a process starts;
  fixed:   MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ at 128 KiB in the spawned sides'
           environment, so every large buffer is mapped and unmapped on its own. By default glibc
           raises its mmap threshold to the size of the largest mapped buffer freed so far, after
           which the layers FSDP gathers and frees on every pass are taken from the heap, and the
           heap keeps what they freed.
Beside each peak, the seconds the side took to train (the allocator's cost in time).

--init says how every side gets its weights: "seed" (default) builds the seeded model whole in
each process (an FSDP rank then shards it); "checkpoint" saves that model once as safetensors
and every side loads it, an FSDP rank shard by shard (never the whole model), as `gyre run`
loads `model.init`.

    .venv/bin/python benchmarks/bench_fsdp_memory.py [--hidden 512] [--layers 8] [--steps 2]
        [--init seed|checkpoint]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from bars import bar
from rich.console import Console

TARGET = 0.6
console = Console(width=140)


def _model(hidden: int, layers: int) -> dict[str, object]:
    return {
        "model_type": "qwen3",
        "vocab_size": 32_000,
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": hidden // 8,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
    }


def _peak_mib() -> float:
    """This process's peak resident set since it started its program (VmHWM, Linux: KiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def _side(
    rank: int,
    world: int,
    kind: str,
    hidden: int,
    layers: int,
    steps: int,
    port: int,
    out: str,
    checkpoint: str | None,
) -> None:
    from gyre_train.backends import FsdpBackend, ModelSpec, OptimizerConfig, TorchBackend, TorchTraining
    from gyre_train.cells import (
        SyntheticBatchConfig,
        gradient_share,
        merge_shares,
        ratio_share,
        synthetic_batch,
    )
    from gyre_train.objective import LossConfig

    torch.set_num_threads(1)
    if kind == "idle":
        Path(f"{out}.{rank}").write_text(f"{_peak_mib()} 0 0")
        return
    spec = ModelSpec(
        _model(hidden, layers), seed=1, model_dir=None if checkpoint is None else Path(checkpoint)
    )
    optimizer = OptimizerConfig(kind="adamw", lr=1e-4)
    if kind == "fsdp":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        backend: TorchBackend = FsdpBackend(
            spec, optimizer, TorchTraining(shard="fsdp", ranks=world), group=dist.group.WORLD
        )
    else:
        backend = TorchBackend(spec, optimizer)
    data = SyntheticBatchConfig(groups=2, executions=2, max_rows=2, vocab_size=32_000)
    loss = LossConfig()
    started = time.perf_counter()
    for b in range(steps):
        micro_steps, executions = synthetic_batch(5, b, data)
        clip = merge_shares((ratio_share(backend, s) for s in micro_steps), executions, loss)
        backend.zero_gradients()
        for s in micro_steps:
            gradient_share(backend, s, clip, loss)
        backend.apply_update(backend.flat_gradients())
    Path(f"{out}.{rank}").write_text(f"{_peak_mib()} {backend.numel} {time.perf_counter() - started}")
    if kind == "fsdp":
        dist.destroy_process_group()


MODES: dict[str, dict[str, str]] = {
    "default": {},
    "fixed": {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"},
}


@dataclass(frozen=True)
class Side:
    peak_mib: float
    numel: int
    train_s: float


def _measure(
    kind: str,
    world: int,
    args: argparse.Namespace,
    folder: Path,
    env: dict[str, str],
    checkpoint: Path | None,
) -> list[Side]:
    """``kind`` on ``world`` spawned processes; ``env`` is added to their environment (glibc reads
    its tunables when a process starts)."""
    from gyre_proxy.engines import free_port

    out = folder / kind
    with mock.patch.dict(os.environ, env):  # spawned children inherit it; restored after
        mp.start_processes(
            _side,
            args=(
                world, kind, args.hidden, args.layers, args.steps, free_port(), str(out),
                None if checkpoint is None else str(checkpoint),
            ),
            nprocs=world, start_method="spawn",
        )  # fmt: skip
    figures = [Path(f"{out}.{r}").read_text().split() for r in range(world)]
    return [Side(float(peak), int(numel), float(seconds)) for peak, numel, seconds in figures]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--init", choices=("seed", "checkpoint"), default="seed")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := sorted(set(modes) - set(MODES)):
        parser.error(f"unknown modes {unknown}; of {', '.join(MODES)}")
    verdicts = []
    with bar(console) as progress, tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if args.init == "checkpoint":
            from gyre_train.backends import ModelSpec
            from gyre_train.backends.pytorch import build_model

            checkpoint = Path(tmp) / "checkpoint"
            build_model(ModelSpec(_model(args.hidden, args.layers), seed=1)).save_pretrained(str(checkpoint))
        task = progress.add_task("modes x sides", total=3 * len(modes))
        for mode in modes:
            folder = Path(tmp) / mode
            folder.mkdir()
            sides = []
            for kind, world in (("idle", 1), ("none", 1), ("fsdp", 2)):
                progress.update(task, description=f"{mode}: {kind}")
                sides.append(_measure(kind, world, args, folder, MODES[mode], checkpoint))
                progress.advance(task)
            ((idle,), (whole,), ranks) = sides
            peak = max(r.peak_mib for r in ranks)
            ratio = peak / whole.peak_mib
            verdict = "MET" if ratio <= TARGET else "MISSED"
            verdicts.append(f"{mode} {verdict}")
            console.print(
                f"[bold]{mode}[/bold] allocator {MODES[mode] or '(as started)'}; weights from the {args.init}"
            )
            console.print(
                f"  model: {whole.numel / 1e6:.1f}M parameters; shards per rank: {[r.numel for r in ranks]}"
            )
            console.print(f"  baseline (imports only): {idle.peak_mib:.0f} MiB")
            console.print(
                f"  unsharded process: peak {whole.peak_mib:.0f} MiB, trained in {whole.train_s:.1f} s; "
                f"FSDP ranks: peaks {[round(r.peak_mib) for r in ranks]} MiB, trained in "
                f"{max(r.train_s for r in ranks):.1f} s"
            )
            console.print(
                f"  above the baseline: {(peak - idle.peak_mib) / (whole.peak_mib - idle.peak_mib):.2f}x"
            )
            console.print(
                f"  peak resident per rank, FSDP over 2 ranks / unsharded: {ratio:.2f}x "
                f"(target <= {TARGET}x): {verdict}"
            )
    console.print("verdicts: " + "; ".join(verdicts))


if __name__ == "__main__":
    main()
