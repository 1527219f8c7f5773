"""Trajectory processing, from stored trees to packed micro-steps: admission by role
priority (J_max, draws proportional to unmasked trainable tokens, whole paths masked), token
rows, the stream packing buffer, the trajectory buffer on the store, offline ablations.

Pure numpy over gyre_store: imports no torch, redis or Megatron (in-memory stand-ins and
synthetic data are in ``gyre_train.trajectories.testing``).
"""

from __future__ import annotations

from gyre_train.trajectories.ablation import (
    PAPER_FB_FRACTION,
    AblationReport,
    AblationSetting,
    ExecutionResult,
    SettingSummary,
    run_ablation,
    run_execution,
)
from gyre_train.trajectories.admission import (
    CLAUDE_CODE_ORDER,
    Admission,
    AdmissionConfig,
    AdmittedTrajectory,
    ClassPriority,
    FlatPriority,
    LeafPriority,
    admission_rng,
    admit,
)
from gyre_train.trajectories.buffer import GroupSourceConfig, StoreGroupSource, execution_rows
from gyre_train.trajectories.packing import (
    BatchPacker,
    GroupTicket,
    MicroStep,
    PackingConfig,
    ReadyGroup,
    ReadyGroupSource,
    RowKey,
    execution_coefficient,
    select_oldest,
)
from gyre_train.trajectories.rows import ExecutionRows, TokenRow, materialize_rows
from gyre_train.trajectories.stored import (
    StoredExecution,
    StoredTopology,
    admitted_tokens,
    stored_execution,
    stored_topology,
)
from gyre_train.trajectories.trajectory import (
    AdmissionTree,
    CandidateLeaf,
    ExecutionTokens,
    LeafClass,
    NodeTokens,
)

__all__ = [
    "CLAUDE_CODE_ORDER",
    "PAPER_FB_FRACTION",
    "AblationReport",
    "AblationSetting",
    "Admission",
    "AdmissionConfig",
    "AdmissionTree",
    "AdmittedTrajectory",
    "BatchPacker",
    "CandidateLeaf",
    "ClassPriority",
    "ExecutionResult",
    "ExecutionRows",
    "ExecutionTokens",
    "FlatPriority",
    "GroupSourceConfig",
    "GroupTicket",
    "LeafClass",
    "LeafPriority",
    "MicroStep",
    "NodeTokens",
    "PackingConfig",
    "ReadyGroup",
    "ReadyGroupSource",
    "RowKey",
    "SettingSummary",
    "StoreGroupSource",
    "StoredExecution",
    "StoredTopology",
    "TokenRow",
    "admission_rng",
    "admit",
    "admitted_tokens",
    "execution_coefficient",
    "execution_rows",
    "materialize_rows",
    "run_ablation",
    "run_execution",
    "select_oldest",
    "stored_execution",
    "stored_topology",
]
