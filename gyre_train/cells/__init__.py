"""Streaming training: micro-step claims, the batch board, core and satellite cells, weight
transport between cells and publication to engines, and the processes that run them.

Cells run on seams (`MicroStepQueue`, `BatchBoard`, `CellReplica`, `WeightSink`), with Redis,
torch.distributed and SGLang adapters and in-memory ones in `testing`. Not here: the training
data (`gyre_train.trajectories`), the loss (`gyre_train.objective`), models (`gyre_train.backends`).
"""

from __future__ import annotations

from gyre_train.cells.board import BatchBoard, RedisBatchBoard, SnapshotBoard, SnapshotDescriptor
from gyre_train.cells.cell import BurstPlan, Cell, CellConfig, CellReplica
from gyre_train.cells.claims import (
    MicroStepQueue,
    PendingClaim,
    Phase,
    QueueConfig,
    RedisMicroStepQueue,
    Task,
)
from gyre_train.cells.core import run_core
from gyre_train.cells.elastic import CellEngine, ElasticCell, ElasticConfig
from gyre_train.cells.live import (
    LivePublisher,
    LiveTraining,
    Resume,
    bursts_from,
    feed_batches,
    policy_dir,
    resume_point,
)
from gyre_train.cells.local import (
    BatchResult,
    gradient_share,
    merge_shares,
    ratio_share,
    train_batch_locally,
)
from gyre_train.cells.membership import ReducePlan, TakeOver, Wait, plan_reduction
from gyre_train.cells.metrics import CellMetrics
from gyre_train.cells.node import NodeAgent, NodePlan, TrainerPlan, stop_processes
from gyre_train.cells.processes import CellCluster, run_cell, run_elastic_cell, run_live_cell
from gyre_train.cells.producer import ProducerConfig, stream_batch
from gyre_train.cells.publish import (
    EnginePublisher,
    EnginePublisherConfig,
    PublicationMethod,
    PublishableModel,
    WeightPublisher,
    WeightSink,
)
from gyre_train.cells.replica import CellModel, MegatronCells, RankLayout, Replica, TorchCells
from gyre_train.cells.rollout import (
    RolloutEngine,
    RolloutEngineConfig,
    newest_policy,
    rollout_process,
    serve_rollout,
)
from gyre_train.cells.satellite import run_satellite
from gyre_train.cells.session import (
    TINY_QWEN3,
    DemoSummary,
    SyntheticBatchConfig,
    cell_configs,
    demo_streaming,
    enqueue_batch,
    synthetic_batch,
)
from gyre_train.cells.testing import (
    InMemoryBatchBoard,
    InMemoryClaims,
    InMemoryMicroStepQueue,
    InMemoryWeightSink,
)
from gyre_train.cells.transport import (
    WEIGHT_TRANSPORTS,
    MooncakeTransport,
    TorchDistributedTransport,
    WeightTransport,
    make_transport,
)
from gyre_train.cells.wire import (
    BatchManifest,
    ExecutionTotals,
    RatioShare,
    decode_micro_step,
    encode_micro_step,
)

__all__ = [
    "TINY_QWEN3",
    "WEIGHT_TRANSPORTS",
    "BatchBoard",
    "BatchManifest",
    "BatchResult",
    "BurstPlan",
    "Cell",
    "CellCluster",
    "CellConfig",
    "CellEngine",
    "CellMetrics",
    "CellModel",
    "CellReplica",
    "DemoSummary",
    "ElasticCell",
    "ElasticConfig",
    "EnginePublisher",
    "EnginePublisherConfig",
    "ExecutionTotals",
    "InMemoryBatchBoard",
    "InMemoryClaims",
    "InMemoryMicroStepQueue",
    "InMemoryWeightSink",
    "LivePublisher",
    "LiveTraining",
    "MegatronCells",
    "MicroStepQueue",
    "MooncakeTransport",
    "NodeAgent",
    "NodePlan",
    "PendingClaim",
    "Phase",
    "ProducerConfig",
    "PublicationMethod",
    "PublishableModel",
    "QueueConfig",
    "RankLayout",
    "RatioShare",
    "RedisBatchBoard",
    "RedisMicroStepQueue",
    "ReducePlan",
    "Replica",
    "Resume",
    "RolloutEngine",
    "RolloutEngineConfig",
    "SnapshotBoard",
    "SnapshotDescriptor",
    "SyntheticBatchConfig",
    "TakeOver",
    "Task",
    "TorchCells",
    "TorchDistributedTransport",
    "TrainerPlan",
    "Wait",
    "WeightPublisher",
    "WeightSink",
    "WeightTransport",
    "bursts_from",
    "cell_configs",
    "decode_micro_step",
    "demo_streaming",
    "encode_micro_step",
    "enqueue_batch",
    "feed_batches",
    "gradient_share",
    "make_transport",
    "merge_shares",
    "newest_policy",
    "plan_reduction",
    "policy_dir",
    "ratio_share",
    "resume_point",
    "rollout_process",
    "run_cell",
    "run_core",
    "run_elastic_cell",
    "run_live_cell",
    "run_satellite",
    "serve_rollout",
    "stop_processes",
    "stream_batch",
    "synthetic_batch",
    "train_batch_locally",
]
