"""Peak resident memory per rank: an FSDP cell of two gloo ranks against one unsharded process.

Each side is spawned fresh, builds the same Qwen3 (about 80M parameters unless --hidden/--layers
say otherwise), trains --steps batches of synthetic micro-steps with AdamW and reports its peak
resident set (getrusage's ru_maxrss). An idle process that only imports torch and transformers
is the baseline, measured in the same run: it is printed, and subtracted for the second ratio.
Target: FSDP's largest rank at most 0.6x the unsharded process (weights, gradients and the two
AdamW moments are split in two; the imports, the model built whole once before sharding and a
gathered layer are not). Prints MET or MISSED with the figures.

    .venv/bin/python benchmarks/bench_fsdp_memory.py [--hidden 512] [--layers 8] [--steps 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TARGET = 0.6


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
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _side(
    rank: int, world: int, kind: str, hidden: int, layers: int, steps: int, port: int, out: str
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
        Path(f"{out}.{rank}").write_text(f"{_peak_mib()} 0")
        return
    spec = ModelSpec(_model(hidden, layers), seed=1)
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
    for b in range(steps):
        micro_steps, executions = synthetic_batch(5, b, data)
        clip = merge_shares((ratio_share(backend, s) for s in micro_steps), executions, loss)
        backend.zero_gradients()
        for s in micro_steps:
            gradient_share(backend, s, clip, loss)
        backend.apply_update(backend.flat_gradients())
    Path(f"{out}.{rank}").write_text(f"{_peak_mib()} {backend.numel}")
    if kind == "fsdp":
        dist.destroy_process_group()


def _measure(kind: str, world: int, args: argparse.Namespace, folder: Path) -> list[tuple[float, int]]:
    from gyre_proxy.engines import free_port

    out = folder / kind
    mp.start_processes(
        _side, args=(world, kind, args.hidden, args.layers, args.steps, free_port(), str(out)),
        nprocs=world, start_method="spawn",
    )  # fmt: skip
    figures = [Path(f"{out}.{r}").read_text().split() for r in range(world)]
    return [(float(peak), int(numel)) for peak, numel in figures]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ((idle, _),) = _measure("idle", 1, args, folder)
        ((whole, numel),) = _measure("none", 1, args, folder)
        ranks = _measure("fsdp", 2, args, folder)
    peak = max(p for p, _ in ranks)
    ratio = peak / whole
    print(f"model: {numel / 1e6:.1f}M parameters; shards per rank: {[n for _, n in ranks]}")
    print(f"baseline (imports only): {idle:.0f} MiB")
    print(f"unsharded process: peak {whole:.0f} MiB; FSDP ranks: peaks {[round(p) for p, _ in ranks]} MiB")
    print(f"above the baseline: {(peak - idle) / (whole - idle):.2f}x")
    verdict = "MET" if ratio <= TARGET else "MISSED"
    print(
        f"peak resident per rank, FSDP over 2 ranks / unsharded: {ratio:.2f}x (target <= {TARGET}x): {verdict}"
    )


if __name__ == "__main__":
    main()
