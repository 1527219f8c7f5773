"""A streaming training session end to end: synthetic batches, the producer, the cells, the demo.

`synthetic_batch` packs seeded random groups with the real packer; `enqueue_batch` plays the
stream packing buffer's side of the claim queue; `cell_configs` gives the K cells one run's
settings; `demo_streaming` trains one batch with a core and a satellite against a Redis server
and publishes to an engine, returning what the command line prints. Tests, the benchmark and
`gyre demo` share these; production feeds the queue from the trajectory buffer instead.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import redis
import torch

from gyre_proxy.engines import free_port
from gyre_proxy.engines.refengine import DEFAULT_MODEL_CONFIG
from gyre_train.backends import ModelSpec, OptimizerConfig, TorchBackend
from gyre_train.cells.cell import BurstPlan, CellConfig
from gyre_train.cells.claims import MicroStepQueue, QueueConfig, RedisMicroStepQueue
from gyre_train.cells.processes import CellCluster
from gyre_train.cells.publish import EnginePublisherConfig
from gyre_train.cells.replica import CellModel, MegatronCells, TorchCells
from gyre_train.cells.wire import BatchManifest, ExecutionTotals
from gyre_train.trajectories import BatchPacker, ExecutionRows, MicroStep, PackingConfig, ReadyGroup
from gyre_train.trajectories.testing import synthetic_rows

TINY_QWEN3: dict[str, Any] = {
    "model_type": "qwen3",
    "vocab_size": 512,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True, slots=True)
class SyntheticBatchConfig:
    """Shape of a synthetic batch: B groups of N executions, rows per execution, lengths."""

    groups: int = 2
    executions: int = 4
    max_rows: int = 2
    median_length: float = 24.0
    max_length: int = 48
    token_budget: int = 64
    vocab_size: int = 512


def synthetic_batch(
    seed: int, batch: int, config: SyntheticBatchConfig = SyntheticBatchConfig()
) -> tuple[list[MicroStep], tuple[ExecutionTotals, ...]]:
    """The micro-steps of one packed batch, and its executions (what pass 1 must cover)."""
    rng = np.random.default_rng([seed, batch])
    packer = BatchPacker(PackingConfig(config.token_budget, config.groups, config.executions), batch)
    steps: list[MicroStep] = []
    for g in range(config.groups):
        members = []
        for k in range(config.executions):
            execution_id = f"b{batch}/g{g}/e{k}"
            count = int(rng.integers(1, config.max_rows + 1))
            rows = synthetic_rows(
                rng, execution_id, count, config.median_length, config.max_length, config.vocab_size
            )
            members.append(ExecutionRows(execution_id, float(rng.standard_normal()), rows))
        steps.extend(packer.add_group(ReadyGroup(f"b{batch}/g{g}", 0, tuple(members))))
    executions = tuple(
        ExecutionTotals(e.execution_id, e.advantage, e.target_count) for e in packer.executions
    )
    return steps, executions


def enqueue_batch(
    queue: MicroStepQueue,
    steps: Sequence[MicroStep],
    executions: Sequence[ExecutionTotals],
    delay_s: float = 0.0,
) -> None:
    """Put every micro-step (with `delay_s` between them, as a stream), then the close marker."""
    for step in steps:
        queue.put(step)
        if delay_s:
            time.sleep(delay_s)
    queue.close(BatchManifest.of(queue.batch, len(steps), executions))


def cell_configs(
    *,
    cells: int,
    redis_url: str,
    port: int,
    model: CellModel,
    prefix: str | None = None,
    run_id: str = "run",
    **overrides: Any,
) -> list[CellConfig]:
    """The process configs of one run's K cells (leaders first, then the other ranks of each
    Megatron cell); `overrides` set CellConfig fields for every process."""
    queue = overrides.pop("queue", None) or QueueConfig(prefix or f"gyre:train:{uuid.uuid4().hex[:12]}")
    base = CellConfig(
        run_id=run_id,
        cell=0,
        cells=cells,
        redis_url=redis_url,
        dist_init=f"tcp://127.0.0.1:{port}",
        queue=queue,
        model=model,
        **overrides,
    )
    size = model.ranks_per_cell if isinstance(model, MegatronCells | TorchCells) else 1
    return [replace(base, cell=i, position=p) for p in range(size) for i in range(cells)]


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """What `gyre demo` prints about the training side."""

    micro_steps: int
    policy_version: int
    seconds: float
    parameter_change: float  # max |theta_after - theta_before|
    engine_url: str


def demo_streaming(
    redis_url: str,
    engine_url: str,
    *,
    model_config: dict[str, Any] | None = None,
    seed: int = 0,
    port: int | None = None,
    workdir: Path | None = None,
    database_url: str | None = None,
) -> DemoSummary:
    """Train one batch with a core and a satellite (joining mid-batch) and publish to an engine.

    `model_config` must match the engine's model (by default the reference engine's tiny Qwen3
    built from `seed`, so the engine and the trainer start equal). Raises CellFailedError when a
    cell fails and PublicationError when the engine refuses the weights.
    """
    config = dict(model_config or DEFAULT_MODEL_CONFIG)
    spec = ModelSpec(config, seed=seed)
    data = SyntheticBatchConfig(vocab_size=min(int(config["vocab_size"]), 256))
    steps, executions = synthetic_batch(seed, 0, data)
    with tempfile.TemporaryDirectory(prefix="gyre-demo-") as tmp:
        root = workdir or Path(tmp)
        configs = cell_configs(
            cells=2,
            redis_url=redis_url,
            port=port or free_port(),
            model=spec,
            optimizer=OptimizerConfig(lr=1e-2),
            engines=EnginePublisherConfig((engine_url,), "disk", root / "published"),
            output_dir=root,
            database_url=database_url,
        )
        burst = BurstPlan(batches=(0,), joins={1: (0, max(1, len(steps) // 2))})
        client = redis.Redis.from_url(redis_url)
        started = time.monotonic()
        try:
            with CellCluster(configs, [burst]) as cluster:
                enqueue_batch(RedisMicroStepQueue(client, configs[0].queue, 0), steps, executions, 0.01)
                cluster.wait(timeout_s=120)
            elapsed = time.monotonic() - started
            before = TorchBackend(spec).flat_parameters()
            after = torch.load(root / "params-v1.pt")
        finally:
            client.close()
    return DemoSummary(len(steps), 1, elapsed, float((after - before).abs().max()), engine_url)
